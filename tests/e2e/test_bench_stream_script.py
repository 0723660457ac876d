"""scripts/bench_stream.py runs: a real server, HTTP act and stream clients, its lines.

Timing is not asserted (the script prints numbers); this keeps the script from rotting and
checks that both transports stepped (the clients raise on any refused step).
"""

from __future__ import annotations

import re

import pytest
from server_process import run_script

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_the_stream_benchmark_runs_and_reports_both_transports():
    out = run_script("bench_stream.py", "--duration", "0.4", "--warmup", "0.1", "--rounds", "1", "--concurrency", "2")
    assert out.startswith("machine: ")
    lines = {transport: line for line in out.splitlines() for transport in ("http", "stream")
             if line.startswith(f"c=2   {transport} ")}
    assert set(lines) == {"http", "stream"}, out
    for line in lines.values():
        assert int(re.search(r"(\d+) steps/s", line)[1]) > 0, line
        assert float(re.search(r"CPU +([\d.]+) us/step", line)[1]) > 0, line
    assert "stream/http: p50" in out
