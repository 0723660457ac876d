"""``rlserve export CHECKPOINT`` on new-API-stack checkpoints reproduces RLlib's recorded answers.

Every module of every case of ``newstack_cases`` (RLSERVE_NEWSTACK_DIR plus
tests/fixtures/newstack; a multi-agent case's modules one by one with ``--module-id``) is
exported with the real command line and nothing else. The bundle is loaded with checksums
verified and run the way the server runs it: the server's own pipeline built from the
manifest (the connector stages), ONNX Runtime (and TorchScript on the fixed observations),
the server's action distribution, and the session's windows of one-hot previous actions
and rewards kept as the server keeps them:

- ``fixed``: each raw observation alone from a fresh episode: the server stages' output
  against RLlib's module input where no stage runs in the graph; dist inputs (Q-values for
  DQN), value, the deterministic action, the action for the environment (after
  NormalizeAndClipActions), its logp, and an LSTM's state against the full module's;
- ``episode`` (recurrent cases): every recorded step in order, the state carried by the
  bundle itself and the previous actions/rewards RLlib's episode held: dist inputs, the logp
  of the action RLlib sampled, the trained critic's value and both states.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces as gs
from newstack_cases import NewStackCase, episode_ids, load_case, module_pairs, newstack_dir

from rlserve.models.distributions import flatten_actions
from rlserve.models.export.bundle import Bundle, load_bundle
from rlserve.models.export.cli import export_main
from rlserve.models.export.onnx import onnx_runner
from rlserve.models.export.torchscript import torchscript_runner
from rlserve.service.serving.pipeline import Pipeline

# float32 graphs against RLlib's float32 torch: 1e-5 relative plus the export tolerance's
# absolute floor (the bundle's atol, 1e-6) scaled up to what reordered float32 sums differ by.
RTOL = 1e-5
ATOL = 1e-5


def _pairs() -> list[tuple[str, str]]:
    return module_pairs() or [(f"<no new-stack cases in {newstack_dir()}>", "")]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):
    cache: dict[tuple[str, str], Bundle] = {}

    def get(case: NewStackCase, module_id: str) -> Bundle:
        key = (case.id, module_id)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"{case.path.name}-{module_id}") / "bundle"
            argv = [str(case.checkpoint), "--out", str(out), "--quiet"]
            if len(case.module_ids) > 1:
                argv += ["--module-id", module_id]
            assert export_main(argv) == 0, f"rlserve export {' '.join(argv)} failed"
            cache[key] = load_bundle(out)  # checksums verified
        return cache[key]

    return get


def _case(case_id: str) -> NewStackCase:
    if case_id.startswith("<no new-stack"):
        pytest.fail(f"no new-stack cases found: set RLSERVE_NEWSTACK_DIR (looked in {newstack_dir()})")
    return load_case(case_id)


class ServedBundle:
    """A bundle as the server runs it: pipeline, runtime, distribution, session windows."""

    def __init__(self, bundle: Bundle, runtime: str = "onnx"):
        m = bundle.manifest
        self.manifest, self.signature = m, m.signature
        self.pipeline = Pipeline.from_manifest(m)
        path = bundle.runtime_path(runtime)
        self.run = (onnx_runner(path) if runtime == "onnx"
                    else torchscript_runner(path, m.input_names, m.output_names))
        self.reset()

    def reset(self) -> None:
        prev = self.signature.prev
        self.state = [np.full((1, *s.shape), s.initial_value, np.float32) for s in self.signature.state]
        self.actions = np.zeros((1, max(prev.n_prev_actions, 1), prev.action_width), np.float32)
        self.rewards = np.zeros((1, max(prev.n_prev_rewards, 1)), np.float32)

    def step(self, obs: Any) -> dict[str, Any]:
        feed = {"obs": np.asarray(self.pipeline.preprocess([obs]), np.float32)}
        feed.update({f"state_in_{i}": s for i, s in enumerate(self.state)})
        if self.signature.uses_prev_actions:
            feed["prev_actions"] = self.actions
        if self.signature.uses_prev_rewards:
            feed["prev_rewards"] = self.rewards
        out = self.run(feed)
        dist = self.pipeline.dist_spec.build(out["dist_inputs"])
        action = dist.deterministic_sample()
        self.state = [out[f"state_out_{i}"] for i in range(len(self.state))]
        return {"obs": feed["obs"], "dist_inputs": out["dist_inputs"][0], "value": out["value"][0],
                "action": action, "dist": dist, "state_out": dict(zip(self._state_names, self.state, strict=True))}

    @property
    def _state_names(self) -> list[str]:
        return [s.name for s in self.signature.state]

    def took(self, action: Any, reward: float) -> None:
        """The session's windows after a step: RLlib's raw action (one-hot) and the reward."""
        if self.signature.uses_prev_actions:
            row = self.pipeline.flatten_actions(_batch_of_one(self.pipeline.action_space, action))
            self.actions = np.concatenate([self.actions[:, 1:], row[None]], axis=1)
        if self.signature.uses_prev_rewards:
            self.rewards = np.concatenate([self.rewards[:, 1:], np.float32([[reward]])], axis=1)

    def for_env(self, action: Any) -> Any:
        m = self.manifest
        if m.normalize_actions:
            return self.pipeline.unsquash(action)
        return self.pipeline.clip(action) if m.clip_actions else action


def _batch_of_one(space: Any, value: Any) -> Any:
    dtype = np.float32 if np.dtype(getattr(space, "dtype", np.int64)).kind == "f" else np.int64
    return np.asarray([value], dtype=dtype)


def _close(actual: Any, expected: Any, what: str) -> None:
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64),
                               rtol=RTOL, atol=ATOL, err_msg=what)


def _at(value: Any, i: int) -> Any:
    """Row ``i`` of a recorded field (a Dict action is recorded per key)."""
    if isinstance(value, dict):
        return {k: _at(v, i) for k, v in value.items()}
    return value[i]


def _leaves(value: Any) -> np.ndarray:
    """A recorded action's leaves in RLlib's flat order (Dict keys sorted)."""
    if isinstance(value, dict):
        return np.concatenate([_leaves(value[k]) for k in sorted(value)])
    return np.ravel(np.asarray(value, np.float64))


def _same_action(space: Any, actual: Any, recorded: Any, what: str) -> None:
    got = flatten_actions(space, actual)[0]
    want = _leaves(recorded)
    if isinstance(space, gs.Box) and np.dtype(space.dtype).kind == "f" or isinstance(space, gs.Dict | gs.Tuple):
        _close(got, want, what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def _state_path(name: str, arrays: dict[str, Any]) -> Any:
    node: Any = arrays
    for part in name.split("/"):
        node = node[part]
    return node


def _agent_of(case: NewStackCase, module_id: str) -> str | None:
    if not case.multi_agent:
        return None
    fixed = case.reference["fixed"]
    return next(k.removeprefix("agent_") for k, v in fixed.items()
                if k.startswith("agent_") and v["module_id"] == module_id)


@pytest.mark.parametrize(("case_id", "module_id"), _pairs())
def test_fixed_observations_match_rllib(case_id: str, module_id: str, exported) -> None:
    case = _case(case_id)
    bundle = exported(case, module_id)
    agent = _agent_of(case, module_id)
    fixed = case.fixed(agent)
    observations = case.observations(agent)
    assert observations
    for runtime in ("onnx", "torchscript"):
        served = ServedBundle(bundle, runtime)
        for i, obs in enumerate(observations):
            served.reset()
            got = served.step(obs)
            _check_fixed(served, got, fixed, i, f"{case_id}:{module_id} fixed[{i}] ({runtime})")


def _check_fixed(served: ServedBundle, got: dict[str, Any], fixed: dict[str, Any], i: int, where: str) -> None:
    space = served.pipeline.action_space
    if not served.manifest.connectors["graph"]:  # the server stages' output is the module's input
        _close(got["obs"].ravel(), np.ravel(fixed["connector_out"]["obs"][i]), f"{where}: module input")
    reference_inputs = fixed["q_values"] if "q_values" in fixed else fixed["action_dist_inputs"]
    _close(got["dist_inputs"], reference_inputs[i], f"{where}: dist inputs")
    _same_action(space, got["action"], _at(fixed["action"], i), f"{where}: deterministic action")
    _same_action(space, served.for_env(got["action"]), _at(fixed["action_for_env"], i),
                 f"{where}: action for the env")
    if "logp" in fixed:
        _close(got["dist"].logp(got["action"])[0], fixed["logp"][i], f"{where}: logp")
    if "value" in fixed:
        _close(got["value"], fixed["value"][i], f"{where}: value")
    else:  # DQN and SAC modules have no state-value function: the answer is null
        assert np.isnan(got["value"]), f"{where}: value"
    for name, ours in got["state_out"].items():
        if name != "frames":
            _close(ours[0], _state_path(name, fixed["state_out_full_module"])[i], f"{where}: state {name}")


@pytest.mark.parametrize("case_id", episode_ids())
def test_recurrent_episode_matches_rllib_step_by_step(case_id: str, exported) -> None:
    case = _case(case_id)
    episode = case.reference["episode"]
    replay = episode["full_module_replay"]
    served = ServedBundle(exported(case, case.module_ids[0]))
    space = served.pipeline.action_space
    assert len(episode["obs"]) >= 2
    for t, obs in enumerate(episode["obs"]):
        where = f"{case_id} step {t}"
        got = served.step(obs)
        _close(got["dist_inputs"], episode["action_dist_inputs"][t], f"{where}: dist inputs")
        taken = _batch_of_one(space, episode["action"][t])
        _close(got["dist"].logp(taken)[0], episode["action_logp"][t], f"{where}: logp of RLlib's sampled action")
        _close(got["value"], replay["value"][t], f"{where}: value (the trained critic's)")
        for name, ours in got["state_out"].items():
            if name.startswith("actor") or name in ("h", "c"):
                _close(ours[0], _state_path(name, episode["state_out"][t]), f"{where}: EnvRunner state {name}")
            if name != "frames":
                _close(ours[0], _state_path(name, replay["state_out"][t]), f"{where}: full module state {name}")
        served.took(episode["action"][t], episode["reward"][t])


def test_the_cases_folder_is_found() -> None:
    assert Path(newstack_dir()).is_dir() and module_pairs(), f"no new-stack cases in {newstack_dir()}"
