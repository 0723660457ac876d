"""Train a small PPO policy with real RLlib, save its checkpoint and record RLlib's answers.

Not part of rlserve: it needs ray (run it with a separate environment, never the
project's), e.g.

    python -m venv /tmp/rayenv && /tmp/rayenv/bin/pip install "ray[rllib]==2.60.0" torch msgpack msgpack-numpy
    /tmp/rayenv/bin/python scripts/record_rllib_checkpoint.py OUT_DIR --env CartPole-v1 \\
        --model '{"fcnet_hiddens": [16, 16]}' --filter MeanStdFilter --format msgpack

A custom ModelV2 (``--custom-model MODULE:CLASS``): the class is imported from ``MODULE``
(which must be importable: put its folder on ``PYTHONPATH``) and registered with
``ModelCatalog.register_custom_model(NAME, CLASS)`` (``--custom-name``, default the class
name); the training config's ``model.custom_model`` is ``NAME``. The checkpoint stores only
that name, so the recording process registers the class again before RLlib reloads it.

OUT_DIR gets the layout of ``shared/oracle/checkpoints/<case>/`` (read by
tests/conformance/test_checkpoints.py):

    checkpoint/          the checkpoint as RLlib wrote it (cloudpickle), or converted
                         with ``convert_to_msgpack_checkpoint`` (--format msgpack)
    reference.json       case, kind, recurrent, env, model_overrides, observation_filter,
                         normalize_actions, fixed{...}, episode{...} (recurrent)
    reference.npz        the same arrays ("fixed_<key>", "episode_<key>")
    episode_states.npz   recurrent: state_in/<i>, state_out/<i> per episode step

The answers come from the checkpoint as RLlib reloads it (``_reload``), in a fresh process
(the script runs itself again with ``--record-only``; that flag alone re-records the answers
of an existing ``OUT_DIR/checkpoint`` without training):

- ``fixed``: observations from a random rollout, each fed alone from the initial state
  with zero previous action/reward, ``explore=False``: ``action`` (before unsquashing),
  ``action_unsquashed`` (Box), ``dist_inputs``, ``value``, ``logp`` (RLlib's dist class on
  ``dist_inputs`` and the action; RLlib's own ``action_logp`` fetch is 0 without explore);
- ``episode`` (recurrent): each step is answered twice from the same inputs, with
  ``explore=False`` (``action``, ``dist_inputs``, ``value``, ``logp``) and with
  ``explore=True`` (the sampled ``taken_action`` and ``taken_logp``); the environment steps
  with the unsquashed taken action, and the raw taken action becomes the next step's
  previous action, as RLlib's samplers feed it. GTrXL's state is the memory window per
  layer ``[attention_memory_inference, attention_dim]`` (RLlib returns the newest row; the
  window rolls), and its previous actions/rewards are the last n values, oldest first.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--model", default="{}", help="model config overrides (JSON)")
    p.add_argument("--filter", default="NoFilter")
    p.add_argument("--format", choices=("cloudpickle", "msgpack"), default="cloudpickle")
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--batch", type=int, default=400)
    p.add_argument("--lr", type=float, help="learning rate (default: PPO's, 5e-5)")
    p.add_argument("--fixed", type=int, default=50)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--keep-optimizer", action="store_true", help="keep the optimizer state in the policy file")
    p.add_argument("--custom-model", metavar="MODULE:CLASS",
                   help="a custom ModelV2 class to import and register (MODULE on PYTHONPATH)")
    p.add_argument("--custom-name", help="the name it is registered under (default: the class name)")
    p.add_argument("--record-only", action="store_true",
                   help="no training: record the answers of the existing OUT/checkpoint (in this process)")
    return p.parse_args()


def register_custom_model(args: argparse.Namespace, model: dict) -> dict | None:
    """Import and register ``--custom-model`` and name it in ``model``; its description for
    reference.json (``custom_model``), or None without one."""
    if not args.custom_model:
        return None
    from ray.rllib.models import ModelCatalog

    module_name, _, class_name = args.custom_model.partition(":")
    if not class_name:
        sys.exit("--custom-model: expected MODULE:CLASS")
    module = importlib.import_module(module_name)
    cls = getattr(module, class_name)
    name = args.custom_name or class_name
    ModelCatalog.register_custom_model(name, cls)
    if model.get("custom_model") not in (None, name):
        sys.exit(f"--model names custom_model {model['custom_model']!r}, --custom-model registers {name!r}")
    model["custom_model"] = name
    source = Path(module.__file__)
    return {
        "registered_name": name,
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "module_file": os.path.relpath(source, args.out),  # where the recording found it, from OUT_DIR
        "module_sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
        "class_mro": [f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__ if c is not object],
        "custom_model_config": model.get("custom_model_config", {}),
    }


def _config(args: argparse.Namespace, model: dict):
    from ray.rllib.algorithms.ppo import PPOConfig

    return (
        PPOConfig()
        .api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False)
        .environment(args.env)
        .framework("torch")
        .env_runners(num_env_runners=0, observation_filter=args.filter, rollout_fragment_length="auto")
        .training(model=model, train_batch_size=args.batch, minibatch_size=min(128, args.batch), num_epochs=2)
        .training(**({"lr": args.lr} if args.lr is not None else {}))
        .debugging(seed=args.seed, log_level="ERROR")
    )


def _save(algo, args: argparse.Namespace, target: Path) -> None:
    """An Algorithm checkpoint (cloudpickle), or for msgpack a Policy checkpoint.

    RLlib 2.60 cannot write msgpack for the old stack as is: ``convert_to_msgpack_checkpoint``
    and ``Policy.export_checkpoint(checkpoint_format="msgpack")`` both fail with "can not
    serialize 'ABCMeta' object" (``_serialize_dict`` leaves the classes in
    ``stats_cls_lookup`` and a few others), and the optimizer state it writes has int keys
    that its own ``msgpack.load`` refuses to read back. This writes what ``export_checkpoint`` writes
    after turning those leftovers into dotted names too, and checks that RLlib's own
    ``Policy.from_checkpoint`` reads it back.
    """
    if args.format == "cloudpickle":
        algo.save(str(target))
        return
    import ray
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
    from ray.rllib.policy.policy import Policy
    from ray.rllib.utils.checkpoints import CHECKPOINT_VERSION, try_import_msgpack

    msgpack = try_import_msgpack(error=True)
    policy = algo.get_policy()
    state = policy.get_state()
    state["checkpoint_version"] = str(CHECKPOINT_VERSION)
    # The optimizer state has int keys, which RLlib's msgpack.load (strict_map_key) refuses.
    state["_optimizer_variables"] = []
    config = AlgorithmConfig._serialize_dict(state["policy_spec"]["config"])
    state["policy_spec"]["config"] = _dotted_leftovers(config)
    target.mkdir(parents=True)
    (target / "policy_state.msgpck").write_bytes(msgpack.packb(state))
    (target / "rllib_checkpoint.json").write_text(json.dumps({
        "type": "Policy", "checkpoint_version": state["checkpoint_version"], "format": "msgpack",
        "state_file": "policy_state.msgpck", "ray_version": ray.__version__, "ray_commit": ray.__commit__,
    }))
    reread = Policy.from_checkpoint(str(target)).get_weights()
    for key, value in policy.get_weights().items():
        assert np.array_equal(reread[key], value), key


def _dotted_leftovers(value):
    """Classes, functions and enums that msgpack cannot pack -> their dotted names."""
    import enum

    if isinstance(value, dict):
        return {k: _dotted_leftovers(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_dotted_leftovers(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, type) or callable(value):
        return f"{value.__module__}.{getattr(value, '__qualname__', type(value).__qualname__)}"
    if value.__class__.__module__.startswith(("packaging", "ray")):
        return str(value)
    return value


def _strip_optimizer(checkpoint: Path) -> None:
    """Drop ``_optimizer_variables`` from the policy states (not needed to serve; keeps a
    committed fixture small). Both formats are rewritten the way RLlib wrote them."""
    from ray import cloudpickle as pickle

    for state_file in checkpoint.glob("policies/*/policy_state.*"):
        if state_file.suffix == ".pkl":
            state = pickle.loads(state_file.read_bytes())
            state["_optimizer_variables"] = []
            state_file.write_bytes(pickle.dumps(state))
        else:
            from ray.rllib.utils.checkpoints import try_import_msgpack

            msgpack = try_import_msgpack(error=True)
            state = msgpack.unpackb(state_file.read_bytes(), raw=False, strict_map_key=False)
            state["_optimizer_variables"] = []
            state_file.write_bytes(msgpack.packb(state))


def relative_paths(checkpoint: Path) -> None:
    """The checkpoint's ``state_file`` entries made relative, so the folder can move."""
    for info in checkpoint.rglob("rllib_checkpoint.json"):
        data = json.loads(info.read_text())
        if "state_file" in data:
            data["state_file"] = Path(data["state_file"]).name
        info.write_text(json.dumps(data))


def to_list(x):
    """``x`` with numpy arrays and scalars as lists and numbers, for JSON."""
    if isinstance(x, dict):
        return {k: to_list(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [to_list(v) for v in x]
    if isinstance(x, np.ndarray | np.generic):
        return x.tolist()
    return x


class Recorder:
    def __init__(self, algo, env):
        import torch

        self.torch = torch
        self.algo, self.env = algo, env
        self.policy = algo.get_policy()
        self.model = self.policy.model
        self.space = self.policy.action_space
        cfg = self.policy.config["model"]
        self.attention = bool(cfg.get("use_attention"))
        self.memory = int(cfg.get("attention_memory_inference", 0))
        self.n_prev_actions = int(cfg.get("attention_use_n_prev_actions", 0)) if self.attention else 1
        self.n_prev_rewards = int(cfg.get("attention_use_n_prev_rewards", 0)) if self.attention else 1

    def initial_state(self) -> list[np.ndarray]:
        if self.attention:
            cfg = self.policy.config["model"]
            layers, dim = int(cfg["attention_num_transformer_units"]), int(cfg["attention_dim"])
            return [np.zeros((self.memory, dim), np.float32) for _ in range(layers)]
        return [np.asarray(s, np.float32) for s in self.policy.get_initial_state()]

    def zero_action(self) -> np.ndarray:
        return np.zeros(self.space.shape, dtype=self.space.dtype)

    def prev_inputs(self, actions: list, rewards: list):
        if not self.attention:
            return actions[-1], np.float32(rewards[-1])
        acts = np.stack(actions[-self.n_prev_actions:]) if self.n_prev_actions else None
        rews = np.asarray(rewards[-self.n_prev_rewards:], np.float32) if self.n_prev_rewards else None
        return acts, rews

    def step(self, obs, state, prev_action, prev_reward, explore: bool):
        action, state_out, extra = self.algo.compute_single_action(
            obs, state=state, prev_action=prev_action, prev_reward=prev_reward,
            explore=explore, full_fetch=True, unsquash_action=False, clip_action=False,
        )
        return action, state_out, extra

    def logp(self, dist_inputs, action) -> float:
        torch = self.torch
        dist = self.policy.dist_class(torch.as_tensor(dist_inputs[None]), self.model)
        return float(dist.logp(torch.as_tensor(np.asarray(action)[None])).numpy()[0])

    def unsquash(self, action):
        from ray.rllib.utils.spaces.space_utils import unsquash_action

        return unsquash_action(action, self.space)

    def roll(self, state_in, state_out):
        if not self.attention:
            return [np.asarray(s, np.float32) for s in state_out]
        return [
            np.concatenate([w[1:], np.asarray(o, np.float32)[None]], 0)
            for w, o in zip(state_in, state_out, strict=True)
        ]


def _kind(rec: Recorder, model: dict) -> str:
    if rec.attention:
        return "attention"
    if model.get("use_lstm"):
        return "lstm"
    return "custom" if model.get("custom_model") else "feedforward"


def _record_fixed(rec: Recorder, observations: list) -> dict:
    out: dict = {k: [] for k in ("obs", "action", "dist_inputs", "value", "logp", "action_unsquashed")}
    history = [rec.zero_action()] * max(1, rec.n_prev_actions)
    rewards = [0.0] * max(1, rec.n_prev_rewards)
    for obs in observations:
        prev_a, prev_r = rec.prev_inputs(history, rewards)
        action, _, extra = rec.step(obs, rec.initial_state(), prev_a, prev_r, explore=False)
        out["obs"].append(obs)
        out["action"].append(action)
        out["dist_inputs"].append(extra["action_dist_inputs"])
        out["value"].append(extra["vf_preds"])
        out["logp"].append(rec.logp(extra["action_dist_inputs"], action))
        if hasattr(rec.space, "low"):
            out["action_unsquashed"].append(rec.unsquash(action))
    return out


def _record_episode(rec: Recorder, steps: int, seed: int) -> tuple[dict, dict]:
    keys = ("obs", "prev_action", "prev_reward", "action", "dist_inputs", "value", "logp", "taken_action",
            "taken_logp", "reward", "done", "action_unsquashed")
    out: dict = {k: [] for k in keys}
    states: dict = {}
    obs, _ = rec.env.reset(seed=seed)
    state = rec.initial_state()
    history = [rec.zero_action()] * max(1, rec.n_prev_actions)
    rewards = [0.0] * max(1, rec.n_prev_rewards)
    for _ in range(steps):
        prev_a, prev_r = rec.prev_inputs(history, rewards)
        action, state_out, extra = rec.step(obs, state, prev_a, prev_r, explore=False)
        taken, _, taken_extra = rec.step(obs, state, prev_a, prev_r, explore=True)
        env_action = rec.unsquash(taken) if hasattr(rec.space, "low") else taken
        next_obs, reward, terminated, truncated, _ = rec.env.step(env_action)
        for key, value in (("obs", obs), ("prev_action", prev_a), ("prev_reward", prev_r), ("action", action),
                           ("dist_inputs", extra["action_dist_inputs"]), ("value", extra["vf_preds"]),
                           ("logp", rec.logp(extra["action_dist_inputs"], action)), ("taken_action", taken),
                           ("taken_logp", taken_extra["action_logp"]), ("reward", float(reward)),
                           ("done", bool(terminated or truncated))):
            out[key].append(value)
        if hasattr(rec.space, "low"):
            out["action_unsquashed"].append(rec.unsquash(action))
        for i, (s_in, s_out) in enumerate(zip(state, state_out, strict=True)):
            states.setdefault(f"state_in/{i}", []).append(np.asarray(s_in, np.float32))
            states.setdefault(f"state_out/{i}", []).append(np.asarray(s_out, np.float32))
        state = rec.roll(state, state_out)
        history, rewards = history + [np.asarray(taken)], rewards + [float(reward)]
        obs = next_obs
        if terminated or truncated:
            break
    return out, {k: np.stack(v) for k, v in states.items()}


def _reload(args: argparse.Namespace, model: dict, checkpoint: Path):
    """The algorithm as RLlib restores it from ``checkpoint``: ``Algorithm.from_checkpoint``,
    or for a Policy checkpoint a fresh algorithm whose policy takes the state RLlib's
    ``Policy.from_checkpoint`` read (weights and connectors, i.e. the filter statistics)."""
    from ray.rllib.algorithms.algorithm import Algorithm
    from ray.rllib.policy.policy import Policy

    if (checkpoint / "algorithm_state.pkl").is_file():
        return Algorithm.from_checkpoint(str(checkpoint))
    algo = _config(args, model).build()
    algo.get_policy().set_state(Policy.from_checkpoint(str(checkpoint)).get_state())
    return algo


def _train(args: argparse.Namespace, model: dict) -> None:
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    algo = _config(args, model).build()
    for i in range(args.iterations):
        result = algo.train()
        print(f"iteration {i + 1}: episode_return_mean {result['env_runners'].get('episode_return_mean')}")
    args.out.mkdir(parents=True, exist_ok=True)
    checkpoint = args.out / "checkpoint"
    if checkpoint.exists():
        shutil.rmtree(checkpoint)
    _save(algo, args, checkpoint)
    algo.stop()
    if not args.keep_optimizer:
        _strip_optimizer(checkpoint)
    relative_paths(checkpoint)
    ray.shutdown()


def _record(args: argparse.Namespace, model: dict, custom: dict | None) -> None:
    import gymnasium as gym
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    algo = _reload(args, model, args.out / "checkpoint")
    env = gym.make(args.env)
    rec = Recorder(algo, env)
    rng_env = gym.make(args.env)
    observations, (obs, _) = [], rng_env.reset(seed=args.seed + 1)
    rng_env.action_space.seed(args.seed + 2)
    while len(observations) < args.fixed:
        observations.append(obs)
        obs, _, term, trunc, _ = rng_env.step(rng_env.action_space.sample())
        if term or trunc:
            obs, _ = rng_env.reset()
    reference = {
        "case": args.out.name,
        "kind": _kind(rec, model),
        "recurrent": bool(rec.initial_state()),
        "env": args.env,
        "model_overrides": model,
        "observation_filter": args.filter,
        "normalize_actions": bool(algo.config.normalize_actions),
        "checkpoint_format": args.format,
        **({"custom_model": custom} if custom else {}),
        "fixed": _record_fixed(rec, observations),
    }
    arrays = {f"fixed_{k}": np.asarray(v) for k, v in reference["fixed"].items() if k != "obs" and v}
    if reference["recurrent"]:
        episode, states = _record_episode(rec, args.steps, args.seed + 3)
        reference["episode"] = episode
        arrays.update({f"episode_{k}": np.asarray(v) for k, v in episode.items() if k != "obs" and v})
        np.savez(args.out / "episode_states.npz", **states)
    (args.out / "reference.json").write_text(json.dumps(to_list(reference)))
    np.savez(args.out / "reference.npz", **arrays)
    print(f"wrote {args.out}")


def main() -> None:
    args = _parse()
    # RLlib's from_checkpoint hands the path to pyarrow, which refuses a relative one ("URI has empty scheme").
    args.out = args.out.resolve()
    model = json.loads(args.model)
    custom = register_custom_model(args, model)
    if args.record_only:
        _record(args, model, custom)
        return
    _train(args, model)
    # The answers from a fresh process: nothing of the training process (registry, modules) helps.
    subprocess.run([sys.executable, str(Path(__file__).resolve()), *sys.argv[1:], "--record-only"], check=True)


if __name__ == "__main__":
    main()
