"""``rlserve experience evaluate`` on a log a real server recorded (one server per module).

The server serves the embedded CartPole policy and a small LSTM that reads its previous
action and reward, twice: as ``lstm`` and as ``lstm-b`` (the same weights, another model
name, not logged). The log holds CartPole episodes played with ``explore`` on (and two with
it off), and ``lstm`` episodes; ``lstm-b`` is then stepped over HTTP through each logged
``lstm`` episode, fed the logged actions as ``prev_action`` and the logged rewards, to read
its distribution inputs. Checked: a candidate equal to the behaviour estimates the
observed return exactly; a degraded copy of the CartPole policy is ranked below it with an
interval that excludes the observed return; the shadow columns' path against RLlib's
formulas written plainly; the computed path for a recurrent candidate against the server's
own stepping; and the refusals.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym
import httpx
import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from bundle_edits import edited_copy
from ope_formulas import plain_is, plain_trajectory, plain_wis
from server_process import REPO, ServerProcess, rlserve_command
from svc_bundles import copy_as_version, shared

from rlserve.client.gym_runner import run_episodes
from rlserve.client.policy_client import PolicyClient
from rlserve.models.distributions.catalog import ActionDistSpec
from rlserve.service.evaluation.candidate_probs import Candidate
from rlserve.service.evaluation.cli import experience_main
from rlserve.service.evaluation.evaluate import CandidateRefused, evaluate
from rlserve.service.experience import reader

pytestmark = pytest.mark.e2e

CARTPOLE = REPO / "service" / "default_models" / "cartpole"
LOGGED = json.dumps({"cartpole": 1, "lstm": 1})
LSTM_EPISODES, LSTM_STEPS = 5, 9


@dataclass
class Recorded:
    log: Path
    repo: Path
    degraded: Path  # a folder holding cartpole version 2, the degraded copy
    explore_off_steps: int = 0
    # For each logged lstm episode (by eps_id): lstm-b's dist inputs at each step, over HTTP.
    candidate_dist_inputs: dict[str, np.ndarray] = field(default_factory=dict)


def _play_lstm(client: httpx.Client, rng: np.random.Generator) -> None:
    for k in range(LSTM_EPISODES):
        session = f"lstm-{k}"
        assert client.post("/v1/models/lstm/sessions", json={"session_id": session, "version": "1"}).status_code == 201
        reward = None
        for t in range(LSTM_STEPS + 1):
            body = {"observation": rng.uniform(-1, 1, 4).round(4).tolist(), "session_id": session, "explore": True}
            if reward is not None:
                body["reward"] = reward
            if t == LSTM_STEPS:
                body["truncated"] = True
            answer = client.post("/v1/models/lstm/act", json=body)
            assert answer.status_code == 200, answer.text
            reward = float(rng.normal())


def _logged_lstm_episodes(log: Path) -> list[reader.Episode]:
    """The LSTM's episodes once all are in their files (within RLSERVE_EXPERIENCE_FLUSH_S)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = reader.episodes(log, "lstm") if (log / "lstm" / "episodes").is_dir() else []
        if sum(e.whole for e in found) == LSTM_EPISODES:
            return found
        time.sleep(0.1)  # polling interval, not a wait for a result
    raise TimeoutError("the LSTM episodes did not reach the log")


def _step_candidate_over_http(client: httpx.Client, episodes: list[reader.Episode]) -> dict[str, np.ndarray]:
    """The candidate ``lstm-b`` stepped through each logged episode: the logged observation,
    the logged action of the step before as ``prev_action`` and its reward; its dist inputs
    at each step."""
    out = {}
    for k, episode in enumerate(episodes):
        session = f"v2-{k}"
        assert client.post("/v1/models/lstm-b/sessions", json={"session_id": session}).status_code == 201
        rows = []
        for t in range(len(episode)):
            body = {"observation": np.asarray(episode.observations[t]).tolist(), "session_id": session,
                    "outputs": ["dist_inputs"]}
            if t:
                body.update(prev_action=np.asarray(episode.actions[t - 1]).tolist(), reward=episode.rewards[t - 1])
            answer = client.post("/v1/models/lstm-b/act", json=body)
            assert answer.status_code == 200, answer.text
            rows.append(answer.json()["dist_inputs"])
        out[episode.eps_id] = np.asarray(rows, np.float32)
    return out


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Recorded:
    root = tmp_path_factory.mktemp("evaluate")
    repo = root / "repo"
    shutil.copytree(CARTPOLE, repo / "cartpole" / "1")
    copy_as_version(shared(tmp_path_factory, "lstm") / "lstm", repo / "lstm" / "1", "1")
    # The candidate: the same weights as another model (the log records only "lstm").
    edited_copy(repo / "lstm" / "1", repo / "lstm-b" / "2", edit=lambda d: d.update(name="lstm-b"))
    degraded = root / "candidates"
    degraded.mkdir()
    # Version 2 of the CartPole policy: the same network sampled at temperature 4 (near uniform).
    edited_copy(CARTPOLE, degraded / "cartpole-2", edit=lambda d: d["action_dist"]["kwargs"].update(temperature=4.0))
    log = root / "log"
    server = ServerProcess({"RLSERVE_EXPERIENCE_LOG": str(log), "RLSERVE_EXPERIENCE_MODELS": LOGGED},
                           args=["--repository", str(repo)]).start()
    try:
        cartpole = PolicyClient(server.url, "cartpole")
        run_episodes(cartpole, lambda: gym.make("CartPole-v1"), 16, parallel=4, seed=3, explore=True, max_steps=50)
        off = run_episodes(cartpole, lambda: gym.make("CartPole-v1"), 2, seed=99, explore=False, max_steps=5)
        with httpx.Client(base_url=server.url, timeout=30) as client:
            _play_lstm(client, np.random.default_rng(0))
            dist_inputs = _step_candidate_over_http(client, _logged_lstm_episodes(log))
        server.terminate()  # the shutdown writes what the log holds
    finally:
        server.stop()
    return Recorded(log, repo, degraded, sum(off.lengths), dist_inputs)


def test_a_candidate_equal_to_the_behaviour_estimates_its_observed_return_exactly(recorded):
    result = evaluate(recorded.log, "cartpole", recorded.repo / "cartpole" / "1", bootstrap=200)
    assert result.source == "served" and result.served_by_candidate_steps == result.steps
    assert result.episodes == 16
    for name, estimate in result.estimates.items():
        if name != "dr":  # DR adds and subtracts the candidate's values: equal within rounding
            assert estimate.value == result.behaviour.value, name
    assert result.estimates["dr"].value == pytest.approx(result.behaviour.value, rel=1e-12)
    # Running the bundle again over the logged episodes (other batches than the server's)
    # gives the logged logps back: the ratios are 1 within float32 noise, here exactly.
    for model, path in (("cartpole", recorded.repo / "cartpole" / "1"), ("lstm", recorded.repo / "lstm" / "1")):
        episodes, _ = _whole(recorded.log, model)
        candidate = Candidate(path)
        try:
            computed = candidate.run(episodes, want_value=False).logp
        finally:
            candidate.close()
        for episode, logp in zip(episodes, computed, strict=True):
            np.testing.assert_allclose(logp, np.asarray(episode.action_logp, np.float64), rtol=0, atol=1e-6)


def test_the_degraded_candidate_ranks_below_the_live_policy(recorded):
    result = evaluate(recorded.log, "cartpole", recorded.degraded / "cartpole-2", bootstrap=1000, seed=1)
    assert result.candidate == "cartpole@2" and result.source == "bundle"
    live = result.behaviour.value
    # The trajectory-wise weight multiplies ~50 ratios of about 0.5 / 0.99: the estimate and
    # its whole interval sit far below the live return. (Per-decision IS is not held to its
    # interval unclipped: a step where the behaviour drew its unlikely action has a ratio up
    # to ~100, and on 10 groups of 16 such episodes 4 intervals reached past the live return.)
    trajectory = result.estimates["is_trajectory"]
    assert trajectory.value < live and trajectory.high < live, (trajectory, live)
    assert result.estimates["is"].ess < result.episodes
    clipped = evaluate(recorded.log, "cartpole", recorded.degraded / "cartpole-2", clip=1.0, bootstrap=1000, seed=1)
    assert clipped.estimates["is"].high < live, (clipped.estimates["is"], live)
    # The same by version name from a folder of bundles, on the command line, as JSON.
    done = subprocess.run([*rlserve_command(), "experience", "evaluate", str(recorded.log), "--model", "cartpole",
                           "--candidate", "2", "--bundles", str(recorded.degraded), "--seed", "1", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == json.loads(json.dumps(result.to_dict()))


def test_steps_served_without_explore_leave_their_episodes_out(recorded):
    result = evaluate(recorded.log, "cartpole", recorded.repo / "cartpole" / "1", bootstrap=0)
    assert result.excluded["explore_off_episodes"] == 2
    assert result.excluded["explore_off_steps"] == result.excluded["steps_of_explore_off_episodes"]
    assert result.excluded["explore_off_steps"] == recorded.explore_off_steps


def _whole(log: Path, model: str) -> tuple[list[reader.Episode], list[reader.Episode]]:
    found = reader.episodes(log, model)
    return [e for e in found if e.whole and all(e.explore)], found


def _write_shadow(log: Path, model: str, rows: list[tuple[str, str, float]]) -> None:
    folder = log / model / "shadow"
    folder.mkdir(parents=True, exist_ok=True)
    n = len(rows)
    table = pa.table({
        "event_id": pa.array([r[0] for r in rows], pa.string()),
        "candidate": pa.array([r[1] for r in rows], pa.string()),
        "logp": pa.array([r[2] for r in rows], pa.float64()),
        "actions": pa.array([0] * n, pa.int64()),
        "dist_inputs": pa.array([[0.0, 0.0]] * n, pa.list_(pa.float32())),
        "time": pa.array(np.arange(n, dtype=np.float64)),
    })
    pq.write_table(table, folder / "shadow-test.parquet")


def test_shadow_columns_match_rllib_formulas(recorded, tmp_path):
    log = tmp_path / "log"
    shutil.copytree(recorded.log, log)
    episodes, _ = _whole(log, "cartpole")
    rng = np.random.default_rng(4)
    shadow = {i: float(lp) + float(rng.normal(0, 0.05)) for e in episodes for i, lp in zip(e.event_ids, e.action_logp,
                                                                                            strict=True)}
    rows = [(i, "cartpole@7", lp) for i, lp in shadow.items()]
    rows += [(i, "cartpole@8", 0.0) for i in list(shadow)[:20]]  # another candidate's rows: not read
    _write_shadow(log, "cartpole", rows)
    result = evaluate(log, "cartpole", "7", gamma=0.99, bootstrap=0)
    assert result.source == "shadow" and result.candidate == "cartpole@7" and "dr" not in result.estimates
    plain = [{"rewards": e.rewards, "old_logp": e.action_logp, "new_logp": [shadow[i] for i in e.event_ids]}
             for e in episodes]
    assert result.estimates["is"].value == pytest.approx(plain_is(plain, 0.99), rel=1e-9)
    assert result.estimates["wis"].value == pytest.approx(plain_wis(plain, 0.99), rel=1e-9)
    assert result.estimates["is_trajectory"].value == pytest.approx(plain_trajectory(plain, 0.99, False), rel=1e-9)
    assert result.estimates["wis_trajectory"].value == pytest.approx(plain_trajectory(plain, 0.99, True), rel=1e-9)
    # One evaluated step without a shadow row, and no bundle to compute it: refused.
    _write_shadow(log, "cartpole", rows[1:])
    with pytest.raises(CandidateRefused, match="1 evaluated steps have no shadow logp"):
        evaluate(log, "cartpole", "cartpole@7", bootstrap=0)


def test_a_recurrent_candidate_is_stepped_through_each_episode_with_the_logged_actions(recorded):
    episodes, _ = _whole(recorded.log, "lstm")
    assert len(episodes) == LSTM_EPISODES and all(len(e) == LSTM_STEPS for e in episodes)
    candidate = Candidate(recorded.repo / "lstm-b" / "2")
    try:
        computed = candidate.run(episodes, want_value=True)
        spec = ActionDistSpec.from_json(candidate.policy.bundle.manifest.action_dist)
    finally:
        candidate.close()
    for episode, logp in zip(episodes, computed.logp, strict=True):
        over_http = spec.build(recorded.candidate_dist_inputs[episode.eps_id]).logp(np.stack(episode.actions))
        np.testing.assert_allclose(logp, over_http, rtol=0, atol=1e-6)
        # lstm-b has lstm's weights: fed the logged actions and rewards, it is in the state
        # lstm was in at each step, and gives the logged logps back.
        np.testing.assert_allclose(logp, episode.action_logp, rtol=0, atol=1e-6)
    result = evaluate(recorded.log, "lstm", recorded.repo / "lstm-b" / "2", bootstrap=100)
    assert result.source == "bundle" and result.episodes == LSTM_EPISODES and "dr" in result.estimates


def _edited_log(src: Path, dst: Path, model: str, edit) -> None:
    """A copy of the log with ``edit`` applied to every episode segment's state."""
    shutil.copytree(src, dst)
    for path in (dst / model / "episodes").glob("*.parquet"):
        table = pq.read_table(path)
        items = []
        for item in table.column("item").to_pylist():
            state = msgpack.unpackb(item, strict_map_key=False)
            edit(state)
            items.append(msgpack.packb(state))
        pq.write_table(table.set_column(table.schema.get_field_index("item"), "item", pa.array(items, pa.binary())),
                       path)


def _nan_logp(state) -> None:
    """Every action_logp NaN (as a policy whose distribution defines none)."""
    logp = state["extra_model_outputs"]["action_logp"]["data"]
    logp[b"data"] = np.full(len(logp[b"data"]) // 4, np.nan, np.float32).tobytes()


@pytest.mark.parametrize("case", ["no_model", "no_folder", "no_logp", "old_format", "bad_gamma", "no_bundle",
                                  "not_a_bundle"])
def test_refusals_are_one_line_and_exit_2(recorded, tmp_path, capsys, case):
    """The command's own entry point in this process (the JSON test above runs it as a program)."""
    log, candidate, extra = recorded.log, str(recorded.repo / "cartpole" / "1"), []
    model, expected = "cartpole", ""
    if case == "no_model":
        model, expected = "nothing-here", "has no episodes of model 'nothing-here'"
    elif case == "no_folder":
        log, expected = tmp_path / "nowhere", "is not a folder"
    elif case == "no_logp":
        log = tmp_path / "log"
        _edited_log(recorded.log, log, "cartpole", _nan_logp)
        expected = "has no behaviour logp"
    elif case == "old_format":
        log = tmp_path / "log"
        _edited_log(recorded.log, log, "cartpole", lambda state: state["custom_data"].pop("explore"))
        expected = "have no 'explore' field (a log of an older format)"
    elif case == "bad_gamma":
        extra, expected = ["--gamma", "1.5"], "--gamma must be in [0, 1]"
    elif case == "no_bundle":
        candidate, expected = "9", "no shadow logp in the log and no bundle of it was given"
    else:
        candidate, expected = str(tmp_path), "is not a bundle"
    status = experience_main(["evaluate", str(log), "--model", model, "--candidate", candidate, *extra])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and expected in err, err
