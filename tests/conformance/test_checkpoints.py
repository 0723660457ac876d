"""``rlserve export CHECKPOINT`` reproduces RLlib's recorded answers for real RLlib checkpoints.

For every case folder (``checkpoint_cases.py``; RLSERVE_CHECKPOINT_DIR plus this
repository's own fixtures), the checkpoint is exported with the real command line and
nothing else (spaces, model config, filter statistics and normalize_actions all come from
the checkpoint), the bundle is loaded with checksums verified, and its ONNX graph runs in
ONNX Runtime behind the torch-free pieces the server uses (preprocessor, frozen filter,
action distribution) on RLlib's recorded inputs:

- ``fixed``: each observation alone from the initial state with zero previous
  action/reward; deterministic actions equal RLlib's, ``dist_inputs``/``value``/``logp``
  (and ``action_unsquashed`` when the bundle unsquashes by default) within tolerance;
- ``episode`` (recurrent): every step in order, fed the recorded previous action (RLlib's
  raw sampled action, routinely outside a Box's bounds) and reward, with the state the
  graph returned at the previous step (initial again after a recorded ``done``); per step
  the outputs above, the logp of the action RLlib sampled, and the state against
  ``episode_states.npz``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from checkpoint_cases import CheckpointCase, case_ids, checkpoint_dir, exported_checkpoint, load_checkpoint_case
from gymnasium import spaces as gs

from rlserve.models.distributions import ActionDistSpec, flatten_actions, unsquash_actions
from rlserve.models.export.bundle import Bundle, load_bundle
from rlserve.models.export.onnx import onnx_runner
from rlserve.models.filters import filter_from_state
from rlserve.models.preprocessors import get_preprocessor

# float32 graphs against RLlib's float32 torch: relative 1e-5, and 1e-5 absolute for values
# near zero (observed differences are 1e-7 to 4e-6).
RTOL = ATOL = 1e-5


def _ids() -> list[str]:
    return case_ids() or [f"<no checkpoint cases in {checkpoint_dir()}>"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):
    cache: dict[str, Bundle] = {}

    def get(case: CheckpointCase) -> Bundle:
        if case.id not in cache:  # rlserve export's main, once per run (the e2e tests serve the same)
            cache[case.id] = load_bundle(exported_checkpoint(tmp_path_factory, case))  # checksums verified
        return cache[case.id]

    return get


def _recurrent_ids() -> list[str]:
    return [i for i in case_ids() if load_checkpoint_case(i).recurrent]


@pytest.fixture(params=_ids())
def case(request: pytest.FixtureRequest) -> CheckpointCase:
    if request.param.startswith("<no checkpoint cases"):
        pytest.fail(f"no checkpoint cases found: set RLSERVE_CHECKPOINT_DIR (looked in {checkpoint_dir()})")
    return load_checkpoint_case(request.param)


@pytest.fixture(params=_recurrent_ids())
def recurrent_case(request: pytest.FixtureRequest) -> CheckpointCase:
    """Cases with a recorded episode (feedforward cases have none: they get no such test)."""
    return load_checkpoint_case(request.param)


class BundlePolicy:
    """One bundle in ONNX Runtime with the server's torch-free pre- and post-processing."""

    def __init__(self, bundle: Bundle):
        m = bundle.manifest
        self.manifest = m
        self.obs_space, self.action_space = m.observation_space, m.action_space
        self.prep = get_preprocessor(self.obs_space, m.model_config)
        self.filter = filter_from_state(m.filter) if m.filter is not None else None
        self.dist = ActionDistSpec.from_json(m.action_dist)
        self.signature = m.signature
        self.run = onnx_runner(bundle.runtime_path("onnx"))

    def initial_state(self) -> list[np.ndarray]:
        return [np.full((1, *s.shape), s.initial_value, np.float32) for s in self.signature.state]

    def step(self, obs: Any, state: list[np.ndarray], prev_actions: np.ndarray | None = None,
             prev_rewards: np.ndarray | None = None) -> dict[str, Any]:
        flat = self.prep.transform(obs)
        if self.filter is not None:
            flat = self.filter.apply(flat)
        feed = {"obs": flat[None].astype(np.float32)}
        feed.update({f"state_in_{i}": s for i, s in enumerate(state)})
        if self.signature.uses_prev_actions:
            feed["prev_actions"] = prev_actions[None]
        if self.signature.uses_prev_rewards:
            feed["prev_rewards"] = prev_rewards[None]
        out = self.run(feed)
        dist = self.dist.build(out["dist_inputs"])
        action = dist.deterministic_sample()
        return {
            "dist_inputs": out["dist_inputs"][0], "value": out["value"][0], "action": action,
            "logp": dist.logp(action)[0], "dist": dist,
            "state_out": [out[f"state_out_{i}"] for i in range(len(state))],
        }


def _batch_of_one(space: gs.Space, value: Any) -> Any:
    """A recorded model-space action as a batch of one in the space's structure."""
    if isinstance(space, gs.Dict):
        return {k: _batch_of_one(s, value[k]) for k, s in space.spaces.items()}
    if isinstance(space, gs.Tuple):
        return tuple(_batch_of_one(s, v) for s, v in zip(space.spaces, value, strict=True))
    dtype = np.int64 if isinstance(space, gs.Discrete | gs.MultiDiscrete) else space.dtype
    return np.asarray([value], dtype=dtype)


def _close(actual: Any, expected: Any, what: str) -> None:
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64),
                               rtol=RTOL, atol=ATOL, err_msg=what)


def _same_action(policy: BundlePolicy, actual: Any, recorded: Any, what: str) -> None:
    space = policy.action_space
    got = flatten_actions(space, actual)
    want = flatten_actions(space, _batch_of_one(space, recorded))
    if np.issubdtype(np.asarray(recorded).dtype, np.integer) or not isinstance(space, gs.Box):
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        _close(got, want, what)


def _check_outputs(policy: BundlePolicy, got: dict[str, Any], ref: dict[str, Any], i: int, where: str) -> None:
    _same_action(policy, got["action"], ref["action"][i], f"{where}: deterministic action")
    _close(got["dist_inputs"], ref["dist_inputs"][i], f"{where}: dist_inputs")
    _close(got["value"], ref["value"][i], f"{where}: value")
    _close(got["logp"], ref["logp"][i], f"{where}: logp of the deterministic action")
    if policy.manifest.normalize_actions and ref.get("action_unsquashed"):
        unsquashed = unsquash_actions(policy.action_space, got["action"])
        _close(flatten_actions(policy.action_space, unsquashed)[0],
               np.ravel(ref["action_unsquashed"][i]), f"{where}: action_unsquashed")


def test_export_reads_the_checkpoint_settings(case: CheckpointCase, exported) -> None:
    manifest = exported(case).manifest
    ref = case.reference
    assert manifest.normalize_actions == ref["normalize_actions"]
    assert (manifest.filter is not None) == (ref["observation_filter"] != "NoFilter")
    assert manifest.signature.is_recurrent == case.recurrent
    assert manifest.source is not None and manifest.source["observation_filter"] == ref["observation_filter"]
    for key, value in ref.get("model_overrides", {}).items():
        assert manifest.model_config[key] == value, key


def test_fixed_observations_match_rllib(case: CheckpointCase, exported) -> None:
    policy = BundlePolicy(exported(case))
    fixed = case.reference["fixed"]
    assert len(fixed["obs"]) > 0
    zero_a, zero_r = _zero_prev(policy)
    for i, obs in enumerate(fixed["obs"]):
        got = policy.step(obs, policy.initial_state(), zero_a, zero_r)
        _check_outputs(policy, got, fixed, i, f"{case.id} fixed[{i}]")


def _zero_prev(policy: BundlePolicy) -> tuple[np.ndarray, np.ndarray]:
    prev = policy.signature.prev
    lead = (max(prev.n_prev_actions, 1),) if prev.windowed else ()
    reward_lead = (max(prev.n_prev_rewards, 1),) if prev.windowed else ()
    return np.zeros((*lead, prev.action_width), np.float32), np.zeros(reward_lead, np.float32)


class _Window:
    """The last n flat values, oldest first, zeros before the episode start."""

    def __init__(self, n: int, width: tuple[int, ...]):
        self.rows = [np.zeros(width, np.float32)] * n

    def push(self, row: np.ndarray) -> np.ndarray:
        self.rows = [*self.rows[1:], np.asarray(row, np.float32)]
        return np.stack(self.rows)


def _prev_inputs(policy: BundlePolicy, episode: dict[str, Any], t: int, windows: dict[str, _Window]):
    """The model's prev_actions/prev_rewards inputs for step ``t`` from the recording.

    The recording holds per step either the previous action/reward, or (attention) the
    window of the last n of them already; a window is built from the former when needed.
    A model that reads none has None recorded (or values it ignores).
    """
    prev = policy.signature.prev
    actions = rewards = None
    if prev.n_prev_actions:
        actions = _prev_action_input(policy, episode["prev_action"][t], windows["a"])
    if prev.n_prev_rewards:
        recorded = np.asarray(episode["prev_reward"][t], np.float32)
        rewards = windows["r"].push(recorded) if prev.windowed and recorded.ndim == 0 else recorded
    return actions, rewards


def _prev_action_input(policy: BundlePolicy, recorded: Any, window: _Window) -> np.ndarray:
    space, prev = policy.action_space, policy.signature.prev
    action_shape = space.shape if isinstance(space, gs.Box | gs.MultiDiscrete) else ()
    if np.shape(recorded) == tuple(action_shape):  # one raw action, flattened as the graph wants
        row = flatten_actions(space, _batch_of_one(space, recorded))[0]
        return window.push(row) if prev.windowed else row
    return np.asarray(recorded, np.float32).reshape(len(recorded), -1)  # already a window (n, A)


def _check_state(case: CheckpointCase, name: str, t: int, ours: np.ndarray, where: str) -> None:
    """Compare with episode_states.npz: the same shape, or (GTrXL) RLlib's newest memory row
    against the last row of the rolled window the graph returns."""
    if name not in case.states:
        return
    recorded = case.states[name][t]
    mine = ours[0]
    if mine.shape != recorded.shape and mine.shape[1:] == recorded.shape:
        mine = mine[-1]
    assert mine.shape == recorded.shape, f"{where}: {name} shape {mine.shape} != recorded {recorded.shape}"
    _close(mine, recorded, f"{where}: {name}")


def test_recurrent_episode_matches_rllib_step_by_step(recurrent_case: CheckpointCase, exported) -> None:
    case = recurrent_case
    policy = BundlePolicy(exported(case))
    episode = case.reference["episode"]
    prev = policy.signature.prev
    windows = {"a": _Window(max(prev.n_prev_actions, 1), (prev.action_width,)),
               "r": _Window(max(prev.n_prev_rewards, 1), ())}
    state = policy.initial_state()
    steps = len(episode["obs"])
    assert steps > 1
    assert case.states, f"{case.path}: a recurrent case needs episode_states.npz"
    done = episode.get("done") or [False] * steps
    for t in range(steps):
        where = f"{case.id} episode step {t}"
        if t > 0 and done[t - 1]:  # a recording that runs on into a new episode starts it afresh
            state = policy.initial_state()
            windows = {k: _Window(len(w.rows), w.rows[0].shape) for k, w in windows.items()}
        actions, rewards = _prev_inputs(policy, episode, t, windows)
        for i, s in enumerate(state):
            _check_state(case, f"state_in/{i}", t, s, where)
        got = policy.step(episode["obs"][t], state, actions, rewards)
        _check_outputs(policy, got, episode, t, where)
        taken = _batch_of_one(policy.action_space, episode["taken_action"][t])
        _close(got["dist"].logp(taken)[0], episode["taken_logp"][t], f"{where}: logp of RLlib's sampled action")
        for i, s in enumerate(got["state_out"]):
            _check_state(case, f"state_out/{i}", t, s, where)
        state = got["state_out"]


def test_checkpoint_dir_is_not_empty() -> None:
    root = checkpoint_dir()
    assert root.is_dir(), f"{root} does not exist (RLSERVE_CHECKPOINT_DIR)"
    assert any(i.startswith("shared/") for i in case_ids()), f"no checkpoint cases in {root}"
