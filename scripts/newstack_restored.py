"""A new-stack checkpoint as record_newstack_cases.py's answer stage reads it: the restored
EnvRunner's env-to-module and module-to-env pipelines driven by hand around the full
restored module (``Driver``), the module's spaces, config and state dict, the state-dict
layout of the checkpoint's files, and the decoded MeanStdFilter state. Needs ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from newstack_json import _jsonable, _np, space_json


class Driver:
    """The restored EnvRunner's pipelines around the full restored module, driven by hand."""

    def __init__(self, checkpoint: Path):
        from ray.rllib.algorithms.algorithm import Algorithm
        from ray.rllib.connectors.env_to_module import MeanStdFilter
        from ray.rllib.core.rl_module.rl_module import RLModule

        self.algo = Algorithm.from_checkpoint(str(checkpoint.resolve()))
        self.runner = self.algo.env_runner
        path = checkpoint / "learner_group" / "learner" / "rl_module" / "default_policy"
        self.module = RLModule.from_checkpoint(str(path.resolve()))
        self.module.eval()
        self.filters = [c for c in self.runner._env_to_module.connectors if isinstance(c, MeanStdFilter)]
        for connector in self.filters:
            connector._update_stats = False  # serving freezes the statistics
        env = self.runner.env
        self.obs_space = env.single_observation_space
        self.action_space = env.single_action_space

    def episode(self, obs: Any):
        from ray.rllib.env.single_agent_episode import SingleAgentEpisode

        episode = SingleAgentEpisode(observation_space=self.obs_space, action_space=self.action_space)
        episode.add_env_reset(observation=obs, infos={})
        return episode

    def step(self, episode, explore: bool) -> dict[str, Any]:
        import torch

        shared: dict[str, Any] = {}
        batch = self.runner._env_to_module(episodes=[episode], batch={}, explore=explore, rl_module=self.module,
                                           shared_data=shared)
        record = {"connector_out": _np({k: v for k, v in batch.items() if k in ("obs", "state_in")})}
        with torch.no_grad():
            out = self.module.forward_exploration(batch, t=0) if explore else self.module.forward_inference(batch)
            if hasattr(self.module, "compute_values"):
                record["value"] = _np(self.module.compute_values(batch)).reshape(-1)[0]
            if type(self.module).__name__.startswith("DefaultDQN"):
                qf = self.module.compute_q_values(batch)
                record["q_values"] = _np(qf["qf_preds"])[0]
        if "action_dist_inputs" in out:
            record["action_dist_inputs"] = _np(out["action_dist_inputs"]).reshape(1, -1)[0]
        if "state_out" in out:
            record["state_out"] = _unbatch_state(_np(out["state_out"]))
        to_env = self.runner._module_to_env(rl_module=self.module, batch=out, episodes=[episode], explore=explore,
                                            shared_data=shared)

        def first(column: Any) -> Any:
            """The one env's item of a column: a list per env, or a structure of batched arrays."""
            if isinstance(column, list | tuple):
                return column[0]
            if isinstance(column, dict):
                return {k: first(v) for k, v in column.items()}
            return column[0]

        actions = to_env.pop("actions")
        for_env = to_env.pop("actions_for_env", actions)
        record["action"] = _np(first(actions))
        record["action_for_env"] = _np(first(for_env))
        if "action_logp" in to_env:
            # explore=False: RLlib's deterministic "logp" is zeros shaped like the action.
            logp = _np(to_env["action_logp"][0])
            record["rllib_action_logp"] = float(logp) if logp.ndim == 0 else logp
        record["_extra"] = {k: first(v) for k, v in to_env.items()}
        return record

    def logp(self, dist_inputs: np.ndarray, action: Any) -> float:
        import torch
        import tree

        cls = self.module.get_inference_action_dist_cls()
        dist = cls.from_logits(torch.as_tensor(dist_inputs[None]))
        value = tree.map_structure(lambda a: torch.as_tensor(np.asarray(a)[None]), action)
        return float(dist.logp(value)[0])


def _unbatch_state(state: Any) -> Any:
    if isinstance(state, dict):
        return {k: _unbatch_state(v) for k, v in state.items()}
    return np.asarray(state)[0]


def _module_info(driver: Driver, checkpoint: Path) -> dict[str, Any]:
    import dataclasses

    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    runner_module = driver.runner.module
    module = driver.module
    cls = type(runner_module)
    return {
        "env_runner_module_class": f"{cls.__module__}.{cls.__qualname__}",
        "observation_space": space_json(module.observation_space),
        "action_space": space_json(module.action_space),
        "model_config_effective": _jsonable(dataclasses.asdict(DefaultModelConfig()) | dict(module.model_config)),
        "full_state_dict": {k: {"shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch.")}
                            for k, v in module.state_dict().items()},
        "is_stateful": bool(module.is_stateful()),
    }


def _state_dicts(checkpoint: Path) -> dict[str, Any]:
    import pickle

    out = {}
    for path in sorted((checkpoint / "learner_group" / "learner" / "rl_module").glob("*/module_state.*")):
        if path.suffix == ".msgpack":
            import msgpack
            import msgpack_numpy

            state = msgpack.unpackb(path.read_bytes(), object_hook=msgpack_numpy.decode, strict_map_key=False)
        else:
            state = pickle.loads(path.read_bytes())
        out[str(path.relative_to(checkpoint))] = {k: {"shape": list(np.shape(v)), "dtype": str(np.asarray(v).dtype)}
                                                 for k, v in state.items()}
    return out


def _filter_decoded(driver: Driver) -> dict[str, Any] | None:
    if not driver.filters:
        return None
    from ray.rllib.utils.filter import RunningStat

    state = driver.filters[0].get_state()[None]
    stats = [RunningStat.from_state(s) for s in state["running_stats"]]
    return {"None": {"shape": np.asarray(state["shape"]).tolist(), "clip_by_value": state["clip_by_value"],
                     "running_stats": [{"num_pushes": s.num_pushes, "mean_array (float64)": s.mean_array.tolist(),
                                        "sum_sq_diff_array (float64)": s.sum_sq_diff_array.tolist()} for s in stats]}}
