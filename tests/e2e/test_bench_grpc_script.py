"""scripts/bench_grpc.py runs: a real server, the REST and gRPC load generators, its table.

Timing is not asserted (numbers are the script's to print, docs/benchmarks.md records
them); this keeps the script from rotting and checks that every request it sent was
answered without an error, gRPC included.
"""

from __future__ import annotations

import re

import pytest
from server_process import run_script

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_the_grpc_benchmark_runs_and_reports_each_transport():
    out = run_script("bench_grpc.py", "--duration", "0.5", "--warmup", "0.2", "--rounds", "1", "--concurrency", "4")
    rounds = [line for line in out.splitlines() if line.startswith("round 1")]
    assert [line.split(" c=")[0].removeprefix("round 1 ").strip() for line in rounds] == [
        "JSON", "OIP binary", "gRPC", "gRPC stream"]
    assert all(line.endswith(", 0 errors)") for line in rounds), rounds
    (medians,) = [line for line in out.splitlines() if line.startswith("c=4 ")]
    figures = [int(x) for x in re.findall(r"(\d+) obs/s", medians)]
    assert len(figures) == 4 and all(f > 0 for f in figures), medians
