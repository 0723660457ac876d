"""RLlib's answers for a restored new-stack checkpoint whose module is a custom RLModule
class, in the full format of ``shared/oracle/custom-modules`` (``newstack/README.md`` (a)).

Single-agent: ``ModuleDriver`` (newstack_restored's ``Driver``) drives the restored
EnvRunner's env-to-module pipeline, *its own module* (``forward_inference`` /
``forward_exploration``, as ``SingleAgentEnvRunner._sample`` calls them) and module-to-env
pipeline by hand; the full module from ``RLModule.from_checkpoint`` answers ``value`` and
``state_out_full_module`` on the same batch. Multi-agent: ``MultiDriver``, the same around a
``MultiAgentEpisode`` with the full MultiRLModule restored from ``rl_module/``.
``capture`` wraps a runner's pipelines and module to record what ``EnvRunner.sample``
itself computed (the ``crosscheck`` and the stateful ``episode``).

Every module output is cloned before the module-to-env pipeline sees it: a custom
distribution class may edit its logits in place (RLlib's ``TorchCategoricalWithTemp``
divides them by the temperature), and a MultiRLModule may add to the batch it is given.
Needs ray.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from newstack_json import _jsonable
from newstack_json import _np as _np_flat
from newstack_layout import summarize
from newstack_restored import Driver, _module_info, _unbatch_state


def _np(value: Any) -> Any:
    """newstack_json's ``_np`` that also keeps tuples (a Tuple action's components) apart."""
    if isinstance(value, dict):
        return {k: _np(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_np(v) for v in value)
    return _np_flat(value)


def _clone(value: Any) -> Any:
    """A deep copy of a batch or module output, tensors cloned."""
    import torch

    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_clone(v) for v in value)
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    return copy.deepcopy(value)


def _leaves(value: Any) -> list[np.ndarray]:
    if isinstance(value, dict):
        return [x for k in sorted(value, key=str) for x in _leaves(value[k])]
    if isinstance(value, list | tuple):
        return [x for v in value for x in _leaves(v)]
    return [np.asarray(_np(value), np.float64)]


def maxdiff(a: Any, b: Any) -> float:
    """The largest absolute difference between two structures of numbers (same layout)."""
    pairs = list(zip(_leaves(a), _leaves(b), strict=True))
    return max((float(np.max(np.abs(x - y))) if x.size else 0.0 for x, y in pairs), default=0.0)


def _first(column: Any) -> Any:
    """The one env's item of a module-to-env column: a list per env, or batched arrays."""
    if isinstance(column, list):
        return column[0]
    if isinstance(column, dict):
        return {k: _first(v) for k, v in column.items()}
    if isinstance(column, tuple):
        return tuple(_first(v) for v in column)
    return column[0]


def action_value(action: Any) -> Any:
    """An action as numpy: Tuple actions as a list of their components."""
    if isinstance(action, dict):
        return {k: action_value(v) for k, v in action.items()}
    if isinstance(action, list | tuple):
        return [action_value(v) for v in action]
    return _np(action)


def dist_cls_json(cls: type) -> dict[str, Any]:
    """A distribution class by dotted name; a partial class (``get_partial_dist_cls``) by its
    parent and bound kwargs; a class made inside a function also by its bases and ctor
    defaults (e.g. the temperature of ``TorchCategoricalWithTemp``)."""
    if cls.__qualname__.endswith("get_partial_dist_cls.<locals>.DistributionPartial"):
        parent = cls.__mro__[1]
        return {"class": f"{parent.__module__}.{parent.__qualname__}", "made_by": "Distribution.get_partial_dist_cls",
                "partial_kwargs": _jsonable(summarize(cls._merge_kwargs(), 1))}
    out: dict[str, Any] = {"class": f"{cls.__module__}.{cls.__qualname__}"}
    if "<locals>" in cls.__qualname__:
        out["bases"] = [f"{b.__module__}.{b.__qualname__}" for b in cls.__bases__]
        init = cls.__dict__.get("__init__")
        if init is not None and init.__defaults__:
            names = init.__code__.co_varnames[1:init.__code__.co_argcount]
            out["ctor_defaults"] = _jsonable(dict(zip(names[-len(init.__defaults__):], init.__defaults__, strict=True)))
    return out


def module_info(runner_module: Any, full_module: Any, module_dir: Path) -> dict[str, Any]:
    """``modules.<id>``: newstack_restored's fields plus the stored model config, the
    distribution classes, the initial state and the module's repr. A module without a
    catalog reads ``self.model_config`` with its own defaults: its effective config is the
    stored one (DefaultModelConfig does not reach it)."""
    import pickle

    base = _module_info(SimpleNamespace(runner=SimpleNamespace(module=runner_module), module=full_module), module_dir)
    ctor = pickle.loads((module_dir / "class_and_ctor_args.pkl").read_bytes())
    stored = dict(ctor["ctor_args_and_kwargs"][1].get("model_config") or {})
    info = {k: base[k] for k in ("env_runner_module_class",)}
    info.update(env_runner_module_inference_only=bool(runner_module.inference_only),
                from_checkpoint_module_inference_only=bool(full_module.inference_only),
                env_runner_state_dict_keys=sorted(runner_module.state_dict()))
    for key in ("full_state_dict", "observation_space", "action_space"):
        info[key] = base[key]
    info["model_config_stored"] = _jsonable(stored)
    catalog = getattr(full_module, "catalog", None)
    info["model_config_effective"] = base["model_config_effective"] if catalog is not None else _jsonable(stored)
    for name in ("inference", "exploration"):
        try:
            info[f"{name}_action_dist_cls"] = dist_cls_json(getattr(full_module, f"get_{name}_action_dist_cls")())
        except Exception as err:  # e.g. a shared encoder's module has no distribution
            info[f"{name}_action_dist_cls"] = {"error": f"{type(err).__name__}: {err}"}
    info["is_stateful"] = base["is_stateful"]
    info["initial_state"] = _jsonable(full_module.get_initial_state()) if base["is_stateful"] else {}
    info["torch_repr"] = repr(full_module)
    return info


# --------------------------------------------------------------------------- drivers

class ModuleDriver(Driver):
    """Driver with the EnvRunner's own module in the loop and the full module beside it."""

    def step(self, episode, explore: bool) -> dict[str, Any]:
        import torch

        runner_module = self.runner.module
        shared: dict[str, Any] = {}
        batch = self.runner._env_to_module(episodes=[episode], batch={}, explore=explore, rl_module=runner_module,
                                           shared_data=shared)
        seen = _clone(batch)
        with torch.no_grad():
            out = runner_module.forward_exploration(batch, t=0) if explore else runner_module.forward_inference(batch)
            kept = _np(_clone(out))
            full = self.module.forward_inference(_clone(seen))
            value = self.module.compute_values(_clone(seen)) if hasattr(self.module, "compute_values") else None
        to_env = self.runner._module_to_env(rl_module=runner_module, batch=out, episodes=[episode], explore=explore,
                                            shared_data=shared)
        record: dict[str, Any] = {"connector_out": _np({k: v for k, v in seen.items() if k in ("obs", "state_in")})}
        if "action_dist_inputs" in kept:
            record["action_dist_inputs"] = np.asarray(kept["action_dist_inputs"]).reshape(1, -1)[0]
        if "state_out" in kept:
            record["state_out"] = _unbatch_state(kept["state_out"])
        actions = to_env.pop("actions")
        record["action"] = action_value(_first(actions))
        record["action_for_env"] = action_value(_first(to_env.pop("actions_for_env", actions)))
        if "action_logp" in to_env:
            logp = _np(to_env["action_logp"][0])
            record["rllib_action_logp"] = float(logp) if logp.ndim == 0 else logp
        if "action_dist_inputs" in kept:
            record["logp"] = self.logp(record["action_dist_inputs"], record["action"])
        if "state_out" in full:
            record["state_out_full_module"] = _unbatch_state(_np(full["state_out"]))
        if value is not None:
            record["value"] = float(_np(value).reshape(-1)[0])
        record["_extra"] = {k: _first(v) for k, v in to_env.items()}
        record["_module_out"] = kept
        record["_full_out"] = _np(full)
        return record

    def logp(self, dist_inputs: np.ndarray, action: Any) -> float:
        return _logp(self.module.get_inference_action_dist_cls(), dist_inputs, action)


class MultiDriver:
    """The restored MultiAgentEnvRunner's pipelines around its own MultiRLModule, one
    MultiAgentEpisode per observation; the full MultiRLModule from ``rl_module/`` beside it."""

    def __init__(self, checkpoint: Path):
        from ray.rllib.algorithms.algorithm import Algorithm
        from ray.rllib.core.rl_module.rl_module import RLModule

        self.algo = Algorithm.from_checkpoint(str(checkpoint.resolve()))
        self.runner = self.algo.env_runner
        self.module = RLModule.from_checkpoint(str((checkpoint / "learner_group/learner/rl_module").resolve()))
        for sub in self.module.values():  # a MultiRLModule is no torch module itself
            sub.eval()

    def episode(self, observations: dict[Any, Any]):
        episodes: list[Any] = [None]
        self.runner._new_episode(0, episodes)
        episodes[0].add_env_reset(observations=observations, infos={})
        return episodes[0]

    def step(self, episode, explore: bool) -> dict[str, Any]:
        import torch

        module = self.runner.module
        shared: dict[str, Any] = {}
        batch = self.runner._env_to_module(episodes=[episode], batch={}, explore=explore, rl_module=module,
                                           shared_data=shared)
        seen = _clone(batch)
        with torch.no_grad():
            out = module.forward_exploration(batch, t=0) if explore else module.forward_inference(batch)
            kept = _np(_clone(out))
            full = _np(self.module.forward_inference(_clone(seen)))
        to_env = self.runner._module_to_env(rl_module=module, batch=out, episodes=[episode], explore=explore,
                                            shared_data=shared)
        actions = _first(to_env.pop("actions"))
        for_env = _first(to_env.pop("actions_for_env", [actions]))
        logps = _first(to_env.get("action_logp", [{}]))
        agents: dict[Any, Any] = {}
        for agent_id in actions:
            mid = episode.module_for(agent_id)
            sub = self.runner.module[mid]
            record: dict[str, Any] = {"module_id": mid, "connector_out": _np(
                {k: v for k, v in seen[mid].items() if k in ("obs", "state_in")})}
            dist_inputs = np.asarray(kept[mid]["action_dist_inputs"]).reshape(1, -1)[0]
            record.update(action_dist_inputs=dist_inputs, action=action_value(actions[agent_id]),
                          action_for_env=action_value(for_env[agent_id]))
            if agent_id in logps:
                record["rllib_action_logp"] = float(_np(logps[agent_id]))
            record["logp"] = _logp(sub.get_inference_action_dist_cls(), dist_inputs, record["action"])
            if hasattr(self.module[mid], "compute_values"):
                with torch.no_grad():
                    record["value"] = float(_np(self.module[mid].compute_values(_clone(seen[mid]))).reshape(-1)[0])
            record["_module_out"] = kept[mid]
            record["_full_out"] = full[mid]
            agents[agent_id] = record
        return agents


def _logp(cls: Any, dist_inputs: np.ndarray, action: Any) -> float:
    """``cls.from_logits(inputs).logp(action)`` on copies (``torch.tensor`` copies: a class
    may divide its logits in place)."""
    import torch
    import tree

    dist = cls.from_logits(torch.tensor(dist_inputs[None]))
    value = tree.map_structure(lambda a: torch.tensor(np.asarray(a)[None]), action)
    return float(dist.logp(value)[0])


# --------------------------------------------------------------------------- what EnvRunner.sample did

@contextmanager
def capture(runner: Any, explore: bool):
    """Wraps the runner's env-to-module pipeline (a copy of the episode it is given, taken
    before the call, and its output), its module's forward call (input and output, cloned)
    and the module-to-env pipeline (its output) for every module call of ``runner.sample``."""
    steps: list[dict[str, Any]] = []
    last: dict[str, Any] = {}
    e2m, m2e, module = runner._env_to_module, runner._module_to_env, runner.module
    name = "forward_exploration" if explore else "forward_inference"
    forward = getattr(module, name)

    def env_to_module(**kwargs):
        episodes = kwargs["episodes"]
        before = copy.deepcopy(episodes[0])
        out = e2m(**kwargs)
        last.update(episode=before, batch_id=id(out), batch=_clone(out))
        return out

    def wrapped_forward(batch, **kwargs):
        assert id(batch) == last["batch_id"], "the module got a batch the pipeline did not make"
        out = forward(batch, **kwargs)
        steps.append({"episode": last["episode"], "batch": last["batch"], "module_out": _np(_clone(out))})
        return out

    def module_to_env(**kwargs):
        out = m2e(**kwargs)
        steps[-1]["to_env"] = _np(_clone({k: v for k, v in out.items()}))
        return out

    runner._env_to_module, runner._module_to_env = env_to_module, module_to_env
    object.__setattr__(module, name, wrapped_forward)
    try:
        yield steps
    finally:
        runner._env_to_module, runner._module_to_env = e2m, m2e
        object.__delattr__(module, name)


def crosscheck_sample(driver: Any, steps: int = 25, seed: int = 11) -> dict[str, Any]:
    """``EnvRunner.sample(num_timesteps=steps, explore=False)`` against the hand-driven path
    on copies of the very episodes the runner fed its pipeline."""
    runner = driver.runner
    runner._seed, runner._needs_initial_reset = seed, True
    with capture(runner, explore=False) as captured:
        runner.sample(num_timesteps=steps, explore=False, force_reset=True)
    diffs = {"connector_out_maxdiff": 0.0, "module_out_maxdiff": 0.0, "actions_maxdiff": 0.0,
             "actions_for_env_maxdiff": 0.0}
    for step in captured:
        mine = driver.step(step["episode"], explore=False)
        seen, out, to_env = _np(step["batch"]), step["module_out"], step["to_env"]
        actions = _first(to_env["actions"])
        for_env = _first(to_env.get("actions_for_env", to_env["actions"]))
        if isinstance(driver, MultiDriver):
            rows = [(row, seen[row["module_id"]], out[row["module_id"]], actions[a], for_env[a])
                    for a, row in mine.items()]
        else:
            rows = [(mine, seen, out, actions, for_env)]
        for row, ref_in, ref_out, ref_action, ref_env in rows:
            for key, a, b in (("connector_out_maxdiff", {k: v for k, v in ref_in.items() if k in ("obs", "state_in")},
                               row["connector_out"]),
                              ("module_out_maxdiff", ref_out, row["_module_out"]),
                              ("actions_maxdiff", action_value(ref_action), row["action"]),
                              ("actions_for_env_maxdiff", action_value(ref_env), row["action_for_env"])):
                diffs[key] = max(diffs[key], maxdiff(a, b))
    return {"steps_compared": len(captured), **diffs}
