"""docs/benchmarks.md opens with the comparison of rlserve and other serving systems that
scripts/bench_peers.py measured (docs/bench-peers.json), and the peers serve rlserve's network.

- The page's two leading tables are exactly what ``bench_peers_results`` renders from the
  committed results file (the functions bench_peers.py prints them with), before anything else.
- The results file is complete: rlserve and at least four other servers measured at every
  scenario and concurrency, without errors, the machine and its load before and after.
- The peers' plain-torch networks (scripts/peers/policy_net.py), loaded with the weights
  bench_peers.py saves from rlserve's catalog models, compute what those models compute.
- The plot script draws the results file; the page refers to no issue number.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "scripts" / "peers"))

from bench_peers_results import CONCURRENCIES, SCENARIOS, load_peers, results_table, systems_table  # noqa: E402
from bench_results import load, table  # noqa: E402

DOCS = ROOT / "docs"
RESULTS = DOCS / "bench-peers.json"
PAGE = DOCS / "benchmarks.md"


def test_the_page_leads_with_the_tables_of_the_results_file() -> None:
    page = PAGE.read_text()
    data = load_peers(RESULTS)
    results, systems = results_table(data), systems_table(data)
    assert results in page and systems in page
    assert page.index("](bench-peers.png)") < page.index(results) < page.index(table(load(DOCS / "benchmarks.json")))
    assert (DOCS / "bench-peers.png").read_bytes().startswith(b"\x89PNG")
    assert "<!-- not-run: peers -->\n```bash\npython scripts/bench_peers.py" in page


def test_the_results_file_has_rlserve_beside_four_peers_in_every_cell() -> None:
    data = load_peers(RESULTS)
    ran = [s["key"] for s in data["systems"] if s["status"] == "ran"]
    peers = [key for key in ran if key not in ("rlserve", "minimal")]
    assert "rlserve" in ran and "minimal" in ran and len(peers) >= 4, ran
    got = {(r["system"], r["scenario"], r["c"]): r for r in data["results"]}
    stateless = {s["key"] for s in data["systems"] if s["state"].startswith("no server-side state")}
    for system in ran:
        for scenario in SCENARIOS:
            if scenario == "lstm" and system in stateless:  # said so in the systems table
                assert not any(key[:2] == (system, scenario) for key in got)
                continue
            for c in CONCURRENCIES:
                result = got[(system, scenario, c)]
                assert result["req_s"] > 0 and result["errors"] == 0, result
                # req/s is kept to 0.1, obs/s from the unrounded rate
                assert abs(result["obs_s"] - result["req_s"] * result["obs_per_request"]) <= 0.05 * 64, result
    for s in data["systems"]:
        assert s["status"] == "ran" or s["status"].startswith("not run: "), s
    machine = data["machine"]
    assert machine["nproc"] >= 1 and machine["cpu"] and machine["pinned"]
    assert len(machine["loadavg_before"]) == 3 and len(machine["loadavg_after"]) == 3


def test_the_page_names_no_issue_and_no_internal_run() -> None:
    page = PAGE.read_text()
    assert not re.search(r"\bissues? \d+|#\d+\b", page, flags=re.I), "the page refers to an issue"
    assert not re.search(r"\b(set [A-Z]|run \d+)\b", page), "the page names an internal run"


def test_the_plot_script_draws_the_peers_results(tmp_path: Path) -> None:
    out = tmp_path / "peers.png"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "plot_benchmarks.py"), "--peers", str(RESULTS),
                           "--out", str(out), "--table"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes().startswith(b"\x89PNG") and out.stat().st_size > 10_000
    data = load_peers(RESULTS)
    assert results_table(data) in done.stdout and systems_table(data) in done.stdout


@pytest.fixture(scope="module")
def models_and_weights(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    from bench_peers import save_weights
    from bench_scenarios import bench_models

    models = bench_models()
    return models, save_weights(models, tmp_path_factory.mktemp("peers"))


def test_the_peers_mlp_computes_rlserves_logits(models_and_weights: tuple[dict, dict]) -> None:
    import torch
    from policy_net import load_net

    models, weights = models_and_weights
    obs = torch.rand(32, 16) * 2 - 1
    with torch.no_grad():
        expected, _ = models["mlp"](obs)
        got = load_net("mlp", str(weights["mlp"]))(obs)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_the_peers_lstm_computes_rlserves_steps_and_keeps_state_per_session(
        models_and_weights: tuple[dict, dict]) -> None:
    import torch
    from policy_net import Policy, load_net

    models, weights = models_and_weights
    net = load_net("lstm", str(weights["lstm"]))
    obs = torch.rand(3, 8, 16) * 2 - 1
    h = c = torch.zeros(8, 256)
    h_ref = c_ref = torch.zeros(8, 256)
    with torch.no_grad():
        for t in range(3):
            expected, _, h_ref, c_ref = models["lstm"](obs[t], h_ref, c_ref)
            got, h, c = net(obs[t], h, c)
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    # The served path: two sessions interleaved in batches, each continuing its own state.
    policy = Policy("lstm", str(weights["lstm"]))
    bodies = [{"observation": [0.1] * 16, "session_id": "a", "episode_start": True},
              {"observation": [0.2] * 16, "session_id": "b", "episode_start": True}]
    policy.act_bodies(bodies)
    state_a = policy.states["a"]
    policy.act_bodies([{"observation": [0.3] * 16, "session_id": "b"}])
    assert policy.states["a"] is state_a and not torch.equal(policy.states["b"][0], state_a[0])
    # ... and a session's next step starts from its own state, as the network's own step does.
    with torch.no_grad():
        _, h_a, _ = net(torch.full((1, 16), 0.1), torch.zeros(1, 256), torch.zeros(1, 256))
    torch.testing.assert_close(state_a[0], h_a[0], rtol=0, atol=1e-6)


def test_the_peers_answer_rlserves_act_bodies(models_and_weights: tuple[dict, dict]) -> None:
    from policy_net import Policy

    _, weights = models_and_weights
    policy = Policy("mlp", str(weights["mlp"]))
    one, many = policy.act_bodies([{"observation": [0.5] * 16}, {"observations": [[0.1] * 16] * 64}])
    assert set(one) == {"action", "logp"} and one["action"] in range(4) and one["logp"] <= 0
    assert len(many["actions"]) == len(many["logp"]) == 64
