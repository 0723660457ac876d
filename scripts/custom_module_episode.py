"""The ``fixed`` answers (single- and multi-agent), the stateful ``episode`` sampled by the
restored EnvRunner itself with the full module's replay beside it, the multi-agent
``policy_mapping`` and the stacked arrays of reference.npz / episode_states.npz, as
record_custom_modules.py writes them (format: ``shared/oracle/newstack/README.md`` (a)).
Needs ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from custom_module_answers import _clone, _first, _np, action_value, capture, maxdiff
from newstack_json import _flat_keys, _stack
from newstack_layout import _ctor_kwargs
from newstack_restored import _unbatch_state

_FIELDS = ("obs", "connector_out", "action_dist_inputs", "state_out", "action", "action_for_env",
           "rllib_action_logp", "logp", "state_out_full_module", "value")


def _tensors(value: Any) -> Any:
    import torch

    if isinstance(value, dict):
        return {k: _tensors(v) for k, v in value.items()}
    return torch.as_tensor(np.array(value))


def _exploration_diff(module: Any, connector_out: dict[str, Any], inference_out: dict[str, Any]) -> float:
    """forward_exploration vs forward_inference on one module input: action_dist_inputs."""
    import torch

    with torch.no_grad():
        out = _np(module.forward_exploration(_tensors(connector_out), t=0))
    key = "action_dist_inputs"
    return maxdiff(out[key], inference_out[key]) if key in out and key in inference_out else 0.0


def _action_outputs(out: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in out.items() if k != "state_out"}


def random_observations(env: gym.Env, count: int, seed: int = 11) -> list[Any]:
    """``count`` observations from episodes with random actions (env seed ``seed``; numpy's
    global generator seeded too, for envs that draw from it; an ``action_mask`` in a Dict
    observation restricts the random action, as RLlib's ActionMaskEnv demands)."""
    np.random.seed(seed)
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    rows = []
    while len(rows) < count:
        rows.append(obs)
        mask = obs.get("action_mask") if isinstance(obs, dict) else None
        action = env.action_space.sample(None if mask is None else mask.astype(np.int8))
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            obs, _ = env.reset()
    return rows


def fixed_single(driver: Any, env: gym.Env, count: int) -> tuple[dict[str, list[Any]], dict[str, Any]]:
    rows, explore_diff, action_diff, state_diff = [], 0.0, 0.0, 0.0
    for obs in random_observations(env, count):
        record = driver.step(driver.episode(obs), explore=False)
        record.pop("_extra")
        out, full = record.pop("_module_out"), record.pop("_full_out")
        explore_diff = max(explore_diff, _exploration_diff(driver.runner.module, record["connector_out"], out))
        action_diff = max(action_diff, maxdiff(_action_outputs(out), _action_outputs(full)))
        if "state_out" in out:
            state_diff = max(state_diff, maxdiff(out["state_out"], full["state_out"]))
        record["obs"] = obs
        rows.append({k: record[k] for k in _FIELDS if k in record})
    vs_full: dict[str, float] = {"action_outputs": action_diff}
    if "state_out" in rows[0]:
        vs_full["state_out"] = state_diff
    extras = {"forward_exploration_vs_inference_maxdiff": explore_diff,
              "env_runner_module_vs_from_checkpoint_module_maxdiff": vs_full}
    return {k: [r[k] for r in rows] for k in rows[0]}, extras


def _both_agents(env: Any, count: int, seed: int = 11) -> list[dict[Any, Any]]:
    """Rows ``{agent_id: obs}`` with every agent, from random actions (a reset whenever an
    agent is done)."""
    for i, aid in enumerate(env.possible_agents):
        env.get_action_space(aid).seed(seed + i)
    obs, _ = env.reset(seed=seed)
    rows = []
    while len(rows) < count:
        rows.append(obs)
        obs, _, terminated, truncated, _ = env.step({a: env.get_action_space(a).sample() for a in obs})
        if any(terminated.values()) or any(truncated.values()) or set(obs) != set(env.possible_agents):
            obs, _ = env.reset()
    return rows


def fixed_multi(driver: Any, env: Any, count: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``fixed.obs[i] = {agent_id: obs}`` and ``fixed.agent_<id>.{module_id, ...}``."""
    observations = _both_agents(env, count)
    per_agent: dict[Any, list[dict[str, Any]]] = {}
    explore_diff, action_diff = 0.0, 0.0
    for obs in observations:
        agents = driver.step(driver.episode(obs), explore=False)
        batch = {r["module_id"]: r["connector_out"] for r in agents.values()}
        with __import__("torch").no_grad():
            explored = _np(driver.runner.module.forward_exploration(_tensors(batch), t=0))
        for aid, record in agents.items():
            out, full = record.pop("_module_out"), record.pop("_full_out")
            explore_diff = max(explore_diff, maxdiff(explored[record["module_id"]]["action_dist_inputs"],
                                                     out["action_dist_inputs"]))
            action_diff = max(action_diff, maxdiff(_action_outputs(out), _action_outputs(full)))
            record["obs"] = obs[aid]
            per_agent.setdefault(aid, []).append(record)
    fixed: dict[str, Any] = {"obs": [{str(a): o for a, o in obs.items()} for obs in observations]}
    for aid, rows in per_agent.items():
        fields = {k: [r[k] for r in rows] for k in rows[0] if k != "obs"}
        fields["module_id"] = rows[0]["module_id"]
        fixed[f"agent_{aid}"] = fields
        fixed[f"_obs_agent_{aid}"] = [r["obs"] for r in rows]  # reference.npz only
    extras = {"forward_exploration_vs_inference_maxdiff": explore_diff,
              "env_runner_module_vs_from_checkpoint_module_maxdiff": {"action_outputs": action_diff}}
    return fixed, extras


def policy_mapping(driver: Any, checkpoint: Path, env: Any) -> dict[str, Any]:
    fn = driver.algo.config.policy_mapping_fn
    name = fn.__name__.encode()
    pickled_name = b"\x8c" + bytes([len(name)]) + name  # the name as a pickled short string, not a metric key
    mapper = next(c for c in driver.runner._env_to_module.connectors if type(c).__name__ == "AgentToModuleMapping")
    return {
        "function": "agent_to_module(agent_id, episode, **kwargs) -> f'p{agent_id}'",
        "stored_as": "cloudpickled function object (by value: code object, globals, name)",
        "files_holding_it": sorted(str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*.pkl")
                                   if pickled_name in p.read_bytes()),
        "as_plain_data": "nothing: no agent->module table is written; module ids appear as the rl_module/<module_id>/ "
                         "directory names and as keys of the MultiRLModule's rl_module_specs (and of the learner's "
                         "optimizer state)",
        "agent_ids": list(env.possible_agents),
        "mapping_evaluated": {str(a): fn(a, None) for a in env.possible_agents},
        "AgentToModuleMapping_ctor_kwargs": _ctor_kwargs(mapper),
    }


def _tuple_dicts(value: Any) -> Any:
    """Tuple actions (lists of components) as ``{"0": ..., "1": ...}`` for reference.npz."""
    if isinstance(value, list):
        return {str(i): _tuple_dicts(v) for i, v in enumerate(value)}
    if isinstance(value, dict):
        return {k: _tuple_dicts(v) for k, v in value.items()}
    return value


def npz_arrays(fixed: dict[str, Any]) -> dict[str, np.ndarray]:
    """reference.npz: ``fixed/<field>[/<key>]`` stacked over the observations (multi-agent:
    ``fixed/agent_<id>/<field>`` and ``fixed/agent_<id>/obs``); pops the npz-only fields."""
    arrays: dict[str, np.ndarray] = {}
    agent_obs = {k.removeprefix("_obs_agent_"): fixed.pop(k) for k in list(fixed) if k.startswith("_obs_agent_")}
    for key, values in sorted(fixed.items(), key=lambda kv: kv[0] == "obs"):  # obs last, as the shared cases
        if key.startswith("agent_"):
            for field, rows in values.items():
                if field != "module_id":
                    _flat_keys(f"fixed/{key}/{field}", _stack([_tuple_dicts(r) for r in rows]), arrays)
                if field == "action_dist_inputs":
                    arrays[f"fixed/{key}/obs"] = np.stack(agent_obs[key.removeprefix("agent_")])
        elif not (key == "obs" and agent_obs):  # multi-agent rows {agent_id: obs} are per agent above
            _flat_keys(f"fixed/{key}", _stack([_tuple_dicts(r) for r in values]), arrays)
    return arrays


def record_episode(driver: Any, steps: int, seed: int = 103) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """``EnvRunner.sample(num_episodes=1, explore=True)`` (env reset seed and
    ``torch.manual_seed`` = ``seed`` just before), its first ``steps`` steps as the runner
    computed them, and the full module's replay of the same module inputs carrying its own
    state."""
    import torch

    runner = driver.runner
    runner._seed, runner._needs_initial_reset = seed, True
    torch.manual_seed(seed)
    with capture(runner, explore=True) as captured:
        episode = runner.sample(num_episodes=1, explore=True)[0]
    length = min(steps, len(captured), len(episode))
    rewards = np.asarray(episode.get_rewards())
    rows, replay, state = [], [], None
    for t in range(length):
        step = captured[t]
        assert len(step["episode"]) == t, "captured steps out of order"
        batch, out = _np(step["batch"]), step["module_out"]
        to_env = step["to_env"]
        with torch.no_grad():
            value = float(_np(driver.module.compute_values(_clone(step["batch"]))).reshape(-1)[0])
            mine = {"obs": _clone(step["batch"])["obs"],
                    "state_in": state if state is not None else _clone(step["batch"]["state_in"])}
            full = driver.module.forward_inference(mine)
            full_value = float(_np(driver.module.compute_values(mine)).reshape(-1)[0])
        replay.append({"state_in": _unbatch_state(_np(mine["state_in"])),
                       "state_out": _unbatch_state(_np(full["state_out"])), "value": full_value,
                       "dist_diff": maxdiff(_np(full["action_dist_inputs"]), out["action_dist_inputs"]),
                       "state_diff": maxdiff(_np(full["state_out"]), out["state_out"])})
        state = full["state_out"]
        done = t == len(episode) - 1
        rows.append({
            "obs": _np(step["episode"].get_observations(-1)), "connector_out": batch["obs"],
            "action_dist_inputs": np.asarray(out["action_dist_inputs"]).reshape(1, -1)[0],
            "action": action_value(_first(to_env["actions"])),
            "action_for_env": action_value(_first(to_env.get("actions_for_env", to_env["actions"]))),
            "action_logp": _np(_first(to_env["action_logp"])), "value": value, "reward": float(rewards[t]),
            "terminated": bool(done and episode.is_terminated), "truncated": bool(done and episode.is_truncated),
            "state_in": _unbatch_state(batch["state_in"]), "state_out": _unbatch_state(out["state_out"])})
    result: dict[str, Any] = {k: [r[k] for r in rows] for k in rows[0]}
    result["length"] = length
    result["full_module_replay"] = {
        "state_in": [r["state_in"] for r in replay], "state_out": [r["state_out"] for r in replay],
        "value": [r["value"] for r in replay],
        "action_dist_inputs_maxdiff_vs_env_runner": max(r["dist_diff"] for r in replay),
        "actor_state_maxdiff_vs_env_runner": max(r["state_diff"] for r in replay)}
    result.update(env_seed=seed, torch_seed=seed, how=(
        "EnvRunner.sample(num_episodes=1, explore=True) on the restored Algorithm's local EnvRunner, env reset with "
        "this seed and torch.manual_seed(seed) just before; captured by wrappers around its env-to-module pipeline, "
        "module.forward_exploration and module-to-env pipeline. value = full module compute_values on the same "
        "module input."))
    states: dict[str, np.ndarray] = {}
    for key in ("obs", "connector_out", "action_dist_inputs", "action_logp"):
        states[key] = _stack(result[key])
    _flat_keys("state_in", _stack(result["state_in"]), states)
    _flat_keys("state_out", _stack(result["state_out"]), states)
    _flat_keys("full_module_state_in", _stack(result["full_module_replay"]["state_in"]), states)
    _flat_keys("full_module_state_out", _stack(result["full_module_replay"]["state_out"]), states)
    return result, states
