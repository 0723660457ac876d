"""scripts/bench_floor.py runs: the minimal app, a copy of rlserve whose batches compute
nothing, and rlserve itself, each answering every request.

Timing is not asserted (docs/benchmarks.md records the numbers); this keeps the script
from rotting: if ``BatchStep._run`` changes so that the copy can no longer be made, or the
copy stops answering, this fails.
"""

from __future__ import annotations

import re

import pytest
from server_process import run_script

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_the_floor_benchmark_runs_all_three_servers_without_errors():
    out = run_script("bench_floor.py", "--rounds", "1", "--concurrency", "2", "--duration", "0.3", "--warmup", "0.1")
    (line,) = [line for line in out.splitlines() if line.startswith("c=2 ")]
    servers = re.findall(r"(\w+) ([\d,]+) req/s [\d.]+ us/req (\d+) errors", line)
    assert [name for name, _, _ in servers] == ["minimal", "floor", "rlserve"], line
    assert all(int(rate.replace(",", "")) > 0 and errors == "0" for _, rate, errors in servers), line
    assert "| 2 | floor / minimal |" in out and "| 2 | rlserve / minimal |" in out
