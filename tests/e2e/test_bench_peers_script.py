"""scripts/bench_peers.py runs at tiny size: rlserve, the minimal app and, where its virtual
environment already exists, the FastAPI peer, every scenario, into a results file whose
tables are the ones the script prints.

Timing is not asserted (docs/benchmarks.md records the numbers). rlserve and the minimal
app always run, so this never passes on nothing; the peer's environment is not made here
(``--no-install``: it would download torch), and without it the results file must say so.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from server_process import REPO, run_script

sys.path.insert(0, str(REPO / "scripts"))

from bench_peers_results import SCENARIOS, load_peers, results_table, systems_table  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_the_peers_benchmark_runs_rlserve_and_the_floor_and_skips_a_missing_peer_by_saying_so(
        tmp_path: Path) -> None:
    out_file = tmp_path / "peers.json"
    out = run_script("bench_peers.py", "--systems", "rlserve", "fastapi", "minimal", "--no-install",
                     "--duration", "0.3", "--warmup", "0.1", "--rounds", "1", "--concurrency", "2",
                     "--json", str(out_file), timeout=600)
    data = load_peers(out_file)
    assert results_table(data) in out and systems_table(data) in out
    status = {s["key"]: s["status"] for s in data["systems"]}
    ran = [key for key, text in status.items() if text == "ran"]
    assert {"rlserve", "minimal"} <= set(ran), status
    assert status["fastapi"] == "ran" or status["fastapi"].startswith("not run: no environment in "), status
    got = {(r["system"], r["scenario"]): r for r in data["results"]}
    for system in ran:
        for scenario in SCENARIOS:
            result = got[(system, scenario)]
            assert result["c"] == 2 and result["req_s"] > 0 and result["errors"] == 0, result
    assert len(data["machine"]["loadavg_before"]) == 3 and len(data["machine"]["loadavg_after"]) == 3
