"""End to end: custom models with their own per-session inputs, served by a real uvicorn process.

For each model kind that keeps something per session (a custom recurrent model's state,
a trajectory-view model's windows of observations, actions and rewards), the policy of
the first recorded case of that kind in tests/fixtures/oracle (RLlib's weights) is exported,
served, and stepped through two
episodes per session over HTTP with ``explore: false``; at every step the served
``dist_inputs`` and ``value`` must equal the catalog model stepped in this process with its
own carried inputs, and an episode start must reset them.

Feedforward custom kinds with their own serving rules are served from the same repository:
RLlib's batch-norm model answers RLlib's recorded outputs, each row as if alone in its
batch, and the same again after many batches (inference mode: the running statistics never
move); RLlib's parametric-actions model answers RLlib's recorded masked logits and actions
for Dict observations sent as JSON, never serves a masked action, and refuses a row whose
``action_mask`` allows nothing with a 422 naming the row's field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from oracle import case_model, load_case_at
from server_process import running_server

from rlserve.models.export.exporter import export_bundle

pytestmark = pytest.mark.e2e
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "oracle"
KINDS = ("custom_recurrent", "trajectory_view")
FEEDFORWARD_KINDS = ("batch_norm", "parametric_actions")
EPISODE_LENGTHS = (5, 3)


def _first_case(kind: str) -> Path:
    for case in sorted(FIXTURES.iterdir()):
        meta_path = case / "case.json"
        if meta_path.is_file() and json.loads(meta_path.read_text())["kind"] == kind:
            return case
    raise AssertionError(f"no case of kind {kind!r} in {FIXTURES}")


def _model(case: Path) -> tuple[torch.nn.Module, Any, Any, dict[str, Any]]:
    model, obs_space, action_space, config = case_model(load_case_at(case))
    return model.eval(), obs_space, action_space, config


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("custom_repo")
    models = {}
    for kind in KINDS + FEEDFORWARD_KINDS:
        model, obs_space, action_space, config = _model(_first_case(kind))
        export_bundle(model, obs_space=obs_space, action_space=action_space, model_config=config,
                      out_dir=repo / kind, name=kind, formats=("onnx",))
        models[kind] = (model, obs_space)
    with running_server(["--repository", str(repo)], env={"RLSERVE_MAX_BATCH_DELAY_MS": "1"}) as url:
        yield url, models


class _Reference:
    """The catalog model stepped in this process, carrying its own state and its own windows
    of previous actions and rewards (zeros before the episode start, oldest first)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.sig = model.signature()
        self.reset()

    def reset(self) -> None:
        self.state = [torch.full((1, *s.shape), s.initial_value) for s in self.sig.state]
        self.actions = torch.zeros((1, self.sig.prev.n_prev_actions, self.sig.prev.action_width))
        self.rewards = torch.zeros((1, self.sig.prev.n_prev_rewards))

    def report(self, reward: float) -> None:
        if self.sig.uses_prev_rewards:
            self.rewards = torch.cat([self.rewards[:, 1:], torch.tensor([[reward]])], dim=1)

    def served(self, action: Any) -> None:
        if self.sig.uses_prev_actions:
            row = torch.tensor(np.asarray(action, np.float32).reshape(1, 1, -1))
            self.actions = torch.cat([self.actions[:, 1:], row], dim=1)

    def step(self, obs: np.ndarray) -> tuple[np.ndarray, float]:
        prev = ([self.actions] if self.sig.uses_prev_actions else []) + (
            [self.rewards] if self.sig.uses_prev_rewards else [])
        with torch.no_grad():
            logits, value, *self.state = self.model(
                torch.from_numpy(obs[None].astype(np.float32)), *self.state, *prev)
        return logits[0].numpy(), float(value[0])


@pytest.mark.parametrize("kind", KINDS)
def test_sessions_step_like_the_catalog(served, kind: str) -> None:
    url, models = served
    model, obs_space = models[kind]
    rng = np.random.default_rng(0)
    with httpx.Client(base_url=url, timeout=30.0) as client:
        for session in ("a", "b"):
            reference = _Reference(model)
            for episode, length in enumerate(EPISODE_LENGTHS):
                reference.reset()
                for t in range(length):
                    obs = rng.uniform(obs_space.low, obs_space.high).astype(np.float32)
                    body: dict[str, Any] = {"observation": obs.tolist(), "session_id": f"{kind}-{session}",
                                            "explore": False, "outputs": ["dist_inputs", "value"]}
                    if t == 0:
                        body["episode_start"] = True
                    else:
                        body["reward"] = float(rng.normal())
                        reference.report(body["reward"])
                    reply = client.post(f"/v1/models/{kind}/act", json=body)
                    assert reply.status_code == 200, reply.text
                    want_logits, want_value = reference.step(obs)
                    got = reply.json()
                    reference.served(got["action"])
                    where = f"{kind} session {session} episode {episode} step {t}"
                    np.testing.assert_allclose(got["dist_inputs"], want_logits, rtol=1e-4, atol=1e-5, err_msg=where)
                    np.testing.assert_allclose(got["value"], want_value, rtol=1e-4, atol=1e-5, err_msg=where)


def _act(client: httpx.Client, kind: str, rows: list[Any]) -> dict[str, Any]:
    reply = client.post(f"/v1/models/{kind}/act", json={"observations": rows, "explore": False,
                                                         "outputs": ["dist_inputs", "value"]})
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_batch_norm_serves_rllibs_inference_answers_row_by_row(served) -> None:
    url, models = served
    _, obs_space = models["batch_norm"]
    case = _first_case("batch_norm")
    with np.load(case / "io.npz") as io:
        obs, want_logits, want_value = io["obs"], io["model_out"], io["value"]
    rng = np.random.default_rng(3)
    others = [rng.uniform(obs_space.low, obs_space.high).astype(np.float32).tolist() for _ in range(12)]
    with httpx.Client(base_url=url, timeout=30.0) as client:
        first = _act(client, "batch_norm", obs.tolist())
        np.testing.assert_allclose(first["dist_inputs"], want_logits, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(first["value"], want_value, rtol=1e-5, atol=1e-5)
        for i, row in enumerate(obs.tolist()):
            alone = _act(client, "batch_norm", [row])
            mixed = _act(client, "batch_norm", others[:i] + [row] + others[i:])
            for got in (alone["dist_inputs"][0], mixed["dist_inputs"][i]):
                np.testing.assert_allclose(got, want_logits[i], rtol=1e-5, atol=1e-5, err_msg=f"row {i}")
            np.testing.assert_allclose(mixed["value"][i], want_value[i], rtol=1e-5, atol=1e-5)
        for _ in range(20):  # had serving updated the statistics, the answers would drift
            _act(client, "batch_norm", others)
        last = _act(client, "batch_norm", obs.tolist())
    np.testing.assert_allclose(last["dist_inputs"], first["dist_inputs"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(last["value"], first["value"], rtol=1e-6, atol=1e-6)


def _pa_rows(case: Path) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    with np.load(case / "io.npz") as data:
        io = {k: data[k] for k in data.files}
    keys = [k[len("obs/"):] for k in io if k.startswith("obs/")]
    rows = [{k: io[f"obs/{k}"][i].tolist() for k in keys} for i in range(len(io["model_out"]))]
    return rows, io


def test_parametric_actions_served_exactly_and_masked(served) -> None:
    url, _ = served
    rows, io = _pa_rows(_first_case("parametric_actions"))
    masks = io["obs/action_mask"].astype(bool)
    with httpx.Client(base_url=url, timeout=30.0) as client:
        got = _act(client, "parametric_actions", rows)
        np.testing.assert_allclose(got["dist_inputs"], io["model_out"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got["value"], io["value"], rtol=1e-5, atol=1e-5)
        assert got["actions"] == io["dist/deterministic_sample"].tolist()
        for seed in range(5):
            reply = client.post("/v1/models/parametric_actions/act",
                                json={"observations": rows, "explore": True, "seeds": [seed] * len(rows),
                                      "session_ids": [f"pa-{seed}-{i}" for i in range(len(rows))],
                                      "episode_starts": [True] * len(rows)})
            assert reply.status_code == 200, reply.text
            for i, action in enumerate(reply.json()["actions"]):
                assert masks[i, action], f"row {i}: served masked action {action} (mask {masks[i].tolist()})"


@pytest.mark.parametrize("batched", [False, True])
def test_parametric_actions_all_masked_row_is_refused(served, batched: bool) -> None:
    url, _ = served
    rows, _ = _pa_rows(_first_case("parametric_actions"))
    bad = {**rows[1], "action_mask": [0] * len(rows[1]["action_mask"])}
    body = {"observations": [rows[0], bad]} if batched else {"observation": bad}
    with httpx.Client(base_url=url, timeout=30.0) as client:
        reply = client.post("/v1/models/parametric_actions/act", json=body)
    assert reply.status_code == 422, reply.text
    error = reply.json()["error"]
    assert error["code"] == "all_actions_masked"
    assert error["field"] == ("observations[1].action_mask" if batched else "observation.action_mask")
    assert "at least one" in str(error["expected"])
    assert error["received"] == bad["action_mask"]


def test_stateless_requests_send_rllibs_windows(served) -> None:
    """Each recorded step of RLlib's episodes, sent without a session with RLlib's own windows."""
    url, _ = served
    with np.load(_first_case("trajectory_view") / "io.npz") as data:
        io = {k: data[k] for k in data.files}
    with httpx.Client(base_url=url, timeout=30.0) as client:
        for t in range(len(io["model_out"])):
            windows = [{"observations": io["prev_n_obs"][t, b, :-1].tolist(),
                        "actions": io["prev_n_actions"][t, b].tolist(),
                        "rewards": io["prev_n_rewards"][t, b].tolist()} for b in range(len(io["model_out"][t]))]
            reply = client.post("/v1/models/trajectory_view/act", json={
                "observations": io["obs"][t].tolist(), "windows": windows, "explore": False,
                "outputs": ["dist_inputs", "value"]})
            assert reply.status_code == 200, reply.text
            np.testing.assert_allclose(reply.json()["dist_inputs"], io["model_out"][t], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(reply.json()["value"], io["value"][t], rtol=1e-5, atol=1e-5)
            single = client.post("/v1/models/trajectory_view/act", json={
                "observation": io["obs"][t, 0].tolist(), "window": windows[0], "explore": False,
                "outputs": ["dist_inputs"]})
            assert single.status_code == 200, single.text
            np.testing.assert_allclose(single.json()["dist_inputs"], io["model_out"][t, 0], rtol=1e-5, atol=1e-5)


def _window_error(client: httpx.Client, model: str, body: dict[str, Any]) -> dict[str, Any]:
    reply = client.post(f"/v1/models/{model}/act", json=body)
    assert 400 <= reply.status_code < 500, reply.text
    return reply.json()["error"]


def test_sent_windows_are_validated(served) -> None:
    url, models = served
    _, obs_space = models["trajectory_view"]
    d = obs_space.shape[0]
    obs = [0.0] * d
    n = models["trajectory_view"][0].signature().prev.n_prev_actions
    good = {"observations": [obs] * (n - 1), "actions": [0] * n, "rewards": [0.0] * n}
    with httpx.Client(base_url=url, timeout=30.0) as client:
        error = _window_error(client, "trajectory_view", {"observation": obs, "window": {**good, "actions": [0]}})
        assert (error["field"], error["expected"], error["received"]) == ("window.actions", f"list of {n}",
                                                                          "list of 1")
        error = _window_error(client, "trajectory_view", {"observation": obs, "window": {"actions": [0] * n}})
        assert error["field"] == "window" and error["received"] == ["actions"]
        bad_obs = {**good, "observations": [[0.0] * (d + 1)] * (n - 1)}
        error = _window_error(client, "trajectory_view", {"observation": obs, "window": bad_obs})
        assert error["field"].startswith("window.observations[0]")
        error = _window_error(client, "trajectory_view", {"observation": obs, "window": {**good, "actions": [99] * n}})
        assert error["field"] == "window.actions[0]"
        error = _window_error(client, "trajectory_view",
                              {"observations": [obs, obs], "windows": [None, {**good, "rewards": [1e39] * n}]})
        assert error["field"] == "windows[1].rewards[0]"
        error = _window_error(client, "trajectory_view",
                              {"observation": obs, "window": good, "session_id": "w", "episode_start": True})
        assert error["field"] == "window" and "session" in error["message"]
        bn_obs = [0.0] * models["batch_norm"][1].shape[0]
        error = _window_error(client, "batch_norm", {"observation": bn_obs, "window": good})
        assert error["field"] == "window" and error["expected"] == "no window"
        error = _window_error(client, "trajectory_view", {"observation": obs, "windows": [good]})
        assert error["field"] == "windows"
        # A refused window changed nothing: the same row without a window still answers.
        ok = client.post("/v1/models/trajectory_view/act", json={"observation": obs, "window": good})
        assert ok.status_code == 200, ok.text
