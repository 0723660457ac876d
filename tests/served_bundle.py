"""A bundle run the way the server runs it, and its answers checked against RLlib's recorded ones.

Shared by the new-stack conformance tests (default modules exported from data, custom
modules exported by tracing): the server's own pipeline built from the manifest, ONNX
Runtime or TorchScript, the server's action distribution, and the session's windows of
one-hot previous actions and rewards kept as the server keeps them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces as gs
from newstack_cases import NewStackCase

from rlserve.models.distributions import flatten_actions
from rlserve.models.export.bundle import Bundle
from rlserve.models.export.onnx import onnx_runner
from rlserve.models.export.torchscript import torchscript_runner
from rlserve.service.engine.pipeline import Pipeline

# float32 graphs against RLlib's float32 torch: 1e-5 relative plus the export tolerance's
# absolute floor (the bundle's atol, 1e-6) scaled up to what reordered float32 sums differ by.
RTOL = 1e-5
ATOL = 1e-5


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
            row = self.pipeline.flatten_actions(batch_of_one(self.pipeline.action_space, action))
            self.actions = np.concatenate([self.actions[:, 1:], row[None]], axis=1)
        if self.signature.uses_prev_rewards:
            self.rewards = np.concatenate([self.rewards[:, 1:], np.float32([[reward]])], axis=1)

    def for_env(self, action: Any) -> Any:
        m = self.manifest
        if m.normalize_actions:
            return self.pipeline.unsquash(action)
        return self.pipeline.clip(action) if m.clip_actions else action


def batch_of_one(space: Any, value: Any) -> Any:
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


def agent_of(case: NewStackCase, module_id: str) -> str | None:
    if not case.multi_agent:
        return None
    fixed = case.reference["fixed"]
    return next(k.removeprefix("agent_") for k, v in fixed.items()
                if k.startswith("agent_") and v["module_id"] == module_id)


def dist_inputs_folded(served: ServedBundle) -> bool:
    """A traced module whose distribution class transforms its inputs answers the parameters
    its constructor makes (``models/traced/dists.py``), not the module's raw dist inputs."""
    return (served.manifest.source or {}).get("dist_inputs") == "the distribution's parameters"


def check_fixed(served: ServedBundle, got: dict[str, Any], fixed: dict[str, Any], i: int, where: str) -> None:
    space = served.pipeline.action_space
    if not served.manifest.connectors["graph"]:  # the server stages' output is the module's input
        _close(got["obs"].ravel(), _leaves(_at(fixed["connector_out"]["obs"], i)), f"{where}: module input")
    reference_inputs = fixed["q_values"] if "q_values" in fixed else fixed["action_dist_inputs"]
    if not dist_inputs_folded(served):
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


def check_episode(served: ServedBundle, episode: dict[str, Any], label: str) -> None:
    """Every recorded step of ``episode`` in order, the state carried by the bundle itself."""
    replay = episode["full_module_replay"]
    space = served.pipeline.action_space
    assert len(episode["obs"]) >= 2
    for t, obs in enumerate(episode["obs"]):
        where = f"{label} step {t}"
        got = served.step(obs)
        if not dist_inputs_folded(served):
            _close(got["dist_inputs"], episode["action_dist_inputs"][t], f"{where}: dist inputs")
        taken = batch_of_one(space, episode["action"][t])
        _close(got["dist"].logp(taken)[0], episode["action_logp"][t], f"{where}: logp of RLlib's sampled action")
        _close(got["value"], replay["value"][t], f"{where}: value (the trained critic's)")
        for name, ours in got["state_out"].items():
            if name.startswith("actor") or name in ("h", "c"):
                _close(ours[0], _state_path(name, episode["state_out"][t]), f"{where}: EnvRunner state {name}")
            if name != "frames":
                _close(ours[0], _state_path(name, replay["state_out"][t]), f"{where}: full module state {name}")
        served.took(episode["action"][t], episode["reward"][t])
