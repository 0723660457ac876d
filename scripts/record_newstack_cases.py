"""Train small RLlib new-API-stack policies, save their checkpoints and record RLlib's answers.

Not part of rlserve: it needs ray (run it with a separate environment, never the
project's), e.g.

    python -m venv /tmp/rayenv && /tmp/rayenv/bin/pip install "ray[rllib]==2.60.0" torch msgpack msgpack-numpy
    /tmp/rayenv/bin/python scripts/record_newstack_cases.py tests/fixtures/newstack [CASE ...]

Each case folder gets the layout of ``shared/oracle/newstack/<case>/`` (its README
describes it; tests/newstack_cases.py reads both), with the fields the tests use:

    checkpoint/        the Algorithm checkpoint as RLlib wrote it (``save_to_path``; with
                       ``use_msgpack`` for the msgpack case), this repository's absolute path
                       in the pickles replaced by a relative one of the same length
    reference.json     case, algo, env, multi_agent, module_ids, recurrent, versions,
                       model_config_overrides, env_to_module_user_connectors,
                       normalize_actions, clip_actions, msgpack_checkpoint,
                       layout.module_state_dicts, modules.<id> (class, spaces, effective model
                       config, state dict), mean_std_filter_state_decoded, fixed, episode
    reference.npz      fixed/<field>[/<key>] stacked over the observations

The answers are recorded in a fresh process (``answer``) from ``Algorithm.from_checkpoint``:
the restored EnvRunner's own env-to-module and module-to-env pipelines are driven by hand
(as ``SingleAgentEnvRunner._sample`` drives them) around the full module restored with
``RLModule.from_checkpoint`` (its critic is the trained one); a MeanStdFilter is frozen.

- ``fixed``: each observation alone from a fresh episode, ``explore=False``;
- ``episode`` (LSTM and frame-stacking cases): one episode with ``explore=True`` from env
  seed 103 after ``torch.manual_seed(103)``, the state carried through the episode.

The environments, the cases and their training stay in this script (RLlib pickles the
environment classes and connector factories by value from ``__main__`` into the
checkpoint); the restored checkpoint's ``Driver`` and readers are in newstack_restored.py,
the JSON and array helpers in newstack_json.py.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from newstack_json import _flat_keys, _jsonable, _stack, externalize
from newstack_restored import Driver, _filter_decoded, _module_info, _state_dicts, _unbatch_state

# --------------------------------------------------------------------------- environments


class DictObsEnv(gym.Env):
    """Dict observation {mode: Discrete(3), pos: Box(2)}; rewarded for matching pos to the mode."""

    def __init__(self, config=None):
        self.observation_space = gym.spaces.Dict({"pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
                                                  "mode": gym.spaces.Discrete(3)})
        self.action_space = gym.spaces.Discrete(3)
        self._t = 0

    def _obs(self):
        return {"pos": self.np_random.uniform(-1, 1, 2).astype(np.float32), "mode": int(self.np_random.integers(3))}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        self._last = self._obs()
        return self._last, {}

    def step(self, action):
        self._t += 1
        reward = float(int(action) == self._last["mode"]) + float(self._last["pos"][0])
        self._last = self._obs()
        return self._last, reward, False, self._t >= 40, {}


class DictActionEnv(gym.Env):
    """Box observation, Dict action {move: Box(2) in [-2, 2], pick: Discrete(3)}."""

    def __init__(self, config=None):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = gym.spaces.Dict({"pick": gym.spaces.Discrete(3),
                                             "move": gym.spaces.Box(-2.0, 2.0, (2,), np.float32)})
        self._t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self.np_random.uniform(-1, 1, 3).astype(np.float32), {}

    def step(self, action):
        self._t += 1
        reward = -float(np.sum(np.square(action["move"]))) + float(int(action["pick"]) == 1)
        return self.np_random.uniform(-1, 1, 3).astype(np.float32), reward, False, self._t >= 40, {}


class ImageEnv(gym.Env):
    """float32 images in [0, 1] of ``shape``; the agent should pick the brightest third."""

    def __init__(self, config=None):
        shape = tuple((config or {}).get("shape", (20, 20, 3)))
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape, np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self._t = 0

    def _obs(self):
        return self.np_random.random(self.observation_space.shape).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        self._last = self._obs()
        return self._last, {}

    def step(self, action):
        self._t += 1
        thirds = np.array_split(self._last, 3, axis=1)
        reward = float(int(action) == int(np.argmax([t.mean() for t in thirds])))
        self._last = self._obs()
        return self._last, reward, False, self._t >= 40, {}


ENVS = {"DictObsEnv": DictObsEnv, "DictActionEnv": DictActionEnv, "ImageEnv": ImageEnv}

# --------------------------------------------------------------------------- cases

_PPO_SMALL = {"train_batch_size_per_learner": 200, "minibatch_size": 50, "num_epochs": 2, "lr": 3e-4}
# name -> what the case exercises; "connectors" are (RLlib class name, kwargs) in pipeline order.
CASES: dict[str, dict[str, Any]] = {
    "ppo_box_layernorm": {"algo": "PPO", "env": "Pendulum-v1", "training": _PPO_SMALL, "model": {
        "fcnet_hiddens": [32, 24], "fcnet_activation": "relu", "fcnet_use_layernorm": True,
        "head_fcnet_hiddens": [16], "head_fcnet_use_layernorm": True, "head_fcnet_activation": "tanh"}},
    "ppo_shared_free_log_std": {"algo": "PPO", "env": "Pendulum-v1", "training": _PPO_SMALL, "model": {
        "fcnet_hiddens": [16], "vf_share_layers": True, "free_log_std": True}, "clip_actions": True,
        "normalize_actions": False},
    "ppo_lstm_prev2": {"algo": "PPO", "env": "CartPole-v1", "training": _PPO_SMALL, "model": {
        "use_lstm": True, "lstm_cell_size": 8, "fcnet_hiddens": [16], "max_seq_len": 10},
        "connectors": [["PrevActionsPrevRewards", {"n_prev_actions": 2, "n_prev_rewards": 3}],
                       ["FlattenObservations", {}]]},
    "ppo_lstm_shared_prev_filter": {"algo": "PPO", "env": "CartPole-v1", "training": _PPO_SMALL, "model": {
        "use_lstm": True, "lstm_cell_size": 8, "fcnet_hiddens": [12, 12], "vf_share_layers": True, "max_seq_len": 10},
        "connectors": [["PrevActionsPrevRewards", {}], ["FlattenObservations", {}], ["MeanStdFilter", {}]]},
    "ppo_pendulum_lstm_filter": {"algo": "PPO", "env": "Pendulum-v1", "training": _PPO_SMALL, "model": {
        "use_lstm": True, "lstm_cell_size": 6, "fcnet_hiddens": [12], "max_seq_len": 10},
        "connectors": [["MeanStdFilter", {"clip_by_value": 5.0}]]},
    "dqn_no_dueling": {"algo": "DQN", "env": "CartPole-v1", "model": {
        "fcnet_hiddens": [16, 16], "head_fcnet_hiddens": [8]}, "training": {
        "dueling": False, "train_batch_size_per_learner": 32, "num_steps_sampled_before_learning_starts": 100,
        "replay_buffer_config": {"type": "PrioritizedEpisodeReplayBuffer", "capacity": 2000}}},
    "sac_small": {"algo": "SAC", "env": "Pendulum-v1", "model": {"fcnet_hiddens": [16, 16],
                  "fusionnet_hiddens": [16]}, "training": {
        "train_batch_size_per_learner": 32, "num_steps_sampled_before_learning_starts": 100,
        "replay_buffer_config": {"type": "PrioritizedEpisodeReplayBuffer", "capacity": 2000}}},
    "ppo_dict_obs_filter": {"algo": "PPO", "env": "DictObsEnv", "training": _PPO_SMALL,
                            "model": {"fcnet_hiddens": [16, 16]},
                            "connectors": [["FlattenObservations", {}], ["MeanStdFilter", {}]]},
    "ppo_dict_actions": {"algo": "PPO", "env": "DictActionEnv", "training": _PPO_SMALL,
                         "model": {"fcnet_hiddens": [16]}},
    "ppo_cnn_valid_silu": {"algo": "PPO", "env": "ImageEnv", "training": _PPO_SMALL, "model": {
        "conv_filters": [[4, 5, 3], [8, [3, 3], 2, "valid"]], "conv_activation": "silu",
        "head_fcnet_hiddens": [8], "head_fcnet_use_layernorm": True}},
    "ppo_frame_stack": {"algo": "PPO", "env": "ImageEnv", "env_config": {"shape": [12, 12, 1]},
                        "training": _PPO_SMALL, "model": {"conv_filters": [[4, 4, 2], [4, 3, 2]]},
                        "connectors": [["FrameStackingEnvToModule", {"num_frames": 3}]],
                        "learner_connectors": [["FrameStackingLearner", {"num_frames": 3}]]},
    "ppo_msgpack": {"algo": "PPO", "env": "CartPole-v1", "training": _PPO_SMALL, "msgpack": True,
                    "model": {"fcnet_hiddens": [16, 16]}},
}


def _connector_factory(specs: list[list[Any]]):
    def make(env, spaces, device):
        from ray.rllib.connectors import env_to_module
        from ray.rllib.connectors.env_to_module import frame_stacking

        def build(name, kwargs):
            return getattr(env_to_module, name, None) or getattr(frame_stacking, name)

        return [build(name, kwargs)(**kwargs) for name, kwargs in specs]

    return make


def _learner_factory(specs: list[list[Any]]):
    def make(obs_space, action_space):
        from ray.rllib.connectors.learner import frame_stacking

        return [getattr(frame_stacking, name)(**kwargs) for name, kwargs in specs]

    return make


def _config(spec: dict[str, Any]):
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.algorithms.sac import SACConfig

    config = {"PPO": PPOConfig, "DQN": DQNConfig, "SAC": SACConfig}[spec["algo"]]()
    env = ENVS.get(spec["env"], spec["env"])
    config.environment(env, env_config=spec.get("env_config", {}),
                       normalize_actions=spec.get("normalize_actions", True),
                       clip_actions=spec.get("clip_actions", False))
    connectors = spec.get("connectors")
    config.env_runners(num_env_runners=0,
                       env_to_module_connector=_connector_factory(connectors) if connectors else None)
    config.rl_module(model_config=spec["model"])
    learner = spec.get("learner_connectors")
    config.training(**spec["training"], **({"learner_connector": _learner_factory(learner)} if learner else {}))
    config.debugging(seed=1234, log_level="ERROR")
    return config


def _init_ray() -> None:
    """A small local Ray, patient with a busy machine (its default start timeout is short)."""
    import os

    os.environ.setdefault("RAY_raylet_start_wait_time_s", "300")
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")


def train(name: str, out: Path) -> None:
    spec = CASES[name]
    _init_ray()
    algo = _config(spec).build_algo()
    for _ in range(spec.get("iterations", 2)):
        algo.train()
    algo.save_to_path(str((out / "checkpoint").resolve()), use_msgpack=bool(spec.get("msgpack")))
    algo.stop()
    scrub_paths(out / "checkpoint")


def scrub_paths(checkpoint: Path) -> None:
    """Replace this repository's absolute path inside the pickles (the co_filename of the
    connector factories cloudpickled by value) by a relative one of the same length, so a
    fixture names no local directory and every pickle stays valid."""
    prefix = (str(Path(__file__).resolve().parents[1]) + "/").encode()
    relative = b"./" * (len(prefix) // 2) + b"/" * (len(prefix) % 2)
    for path in checkpoint.rglob("*.pkl"):
        data = path.read_bytes()
        if prefix in data:
            path.write_bytes(data.replace(prefix, relative))


# --------------------------------------------------------------------------- answers

def _observations(spec: dict[str, Any], count: int, seed: int = 11) -> list[Any]:
    env = ENVS[spec["env"]](spec.get("env_config")) if spec["env"] in ENVS else gym.make(spec["env"])
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    rows = []
    while len(rows) < count:
        rows.append(obs)
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            obs, _ = env.reset()
    return rows


def _fixed(driver: Driver, spec: dict[str, Any], count: int) -> dict[str, list[Any]]:
    rows = []
    for obs in _observations(spec, count):
        record = driver.step(driver.episode(obs), explore=False)
        record.pop("_extra")
        record["obs"] = obs
        if "action_dist_inputs" in record:
            record["logp"] = driver.logp(record["action_dist_inputs"], record["action"])
        if record.get("state_out") is not None:
            record["state_out_full_module"] = record.pop("state_out")
        rows.append(record)
    return {k: [r[k] for r in rows] for k in rows[0]}


def _episode(driver: Driver, spec: dict[str, Any], steps: int, seed: int = 103) -> dict[str, Any]:
    import torch

    env = ENVS[spec["env"]](spec.get("env_config")) if spec["env"] in ENVS else gym.make(spec["env"])
    obs, _ = env.reset(seed=seed)
    torch.manual_seed(seed)
    episode = driver.episode(obs)
    rows = []
    for _ in range(steps):
        record = driver.step(episode, explore=True)
        extra = record.pop("_extra")
        next_obs, reward, terminated, truncated, _ = env.step(record["action_for_env"])
        record.update(obs=obs, reward=float(reward), terminated=bool(terminated), truncated=bool(truncated),
                      action_logp=record.pop("rllib_action_logp"),
                      state_in=_unbatch_state(record["connector_out"].get("state_in", {})))
        rows.append(record)
        episode.add_env_step(observation=next_obs, action=record["action"], reward=reward, infos={},
                             terminated=terminated, truncated=truncated, extra_model_outputs=extra)
        obs = next_obs
        if terminated or truncated:
            break
    out = {k: [r[k] for r in rows] for k in rows[0]}
    out["full_module_replay"] = {"value": out["value"], "state_out": out.get("state_out", [])}
    out["length"] = len(rows)
    return out



def answer(name: str, out: Path, count: int = 30, steps: int = 30) -> None:
    import ray
    import torch

    spec = CASES[name]
    checkpoint = out / "checkpoint"
    _init_ray()
    driver = Driver(checkpoint)
    info = _module_info(driver, checkpoint)
    fixed = _fixed(driver, spec, count)
    reference: dict[str, Any] = {
        "case": name, "algo": spec["algo"], "env": spec["env"], "multi_agent": False,
        "module_ids": ["default_policy"], "recurrent": info["is_stateful"], "ray_version": ray.__version__,
        "torch_version": torch.__version__, "model_config_overrides": spec["model"],
        "env_to_module_user_connectors": [c.__class__.__name__ for c in driver.runner._env_to_module.connectors
                                          if c.__class__.__module__.split(".")[-1] in _USER_MODULES],
        "msgpack_checkpoint": bool(spec.get("msgpack")), "normalize_actions": spec.get("normalize_actions", True),
        "clip_actions": spec.get("clip_actions", False),
        "layout": {"module_state_dicts": _state_dicts(checkpoint)},
        "modules": {"default_policy": info}, "fixed": fixed,
    }
    decoded = _filter_decoded(driver)
    if decoded is not None:
        reference["mean_std_filter_state_decoded"] = decoded
    if info["is_stateful"] or any(c[0].startswith("FrameStacking") for c in spec.get("connectors", [])):
        reference["episode"] = _episode(driver, spec, steps)
    arrays: dict[str, np.ndarray] = {}
    for key, values in fixed.items():
        _flat_keys(f"fixed/{key}", _stack(values), arrays)
    np.savez_compressed(out / "reference.npz", **arrays)
    (out / "reference.json").write_text(json.dumps(externalize(_jsonable(reference))))
    driver.algo.stop()


_USER_MODULES = ("mean_std_filter", "flatten_observations", "prev_actions_prev_rewards", "frame_stacking")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("cases", nargs="*", help=f"default: all of {sorted(CASES)}")
    p.add_argument("--stage", choices=("all", "train", "answer"), default="all")
    args = p.parse_args()
    for name in args.cases or sorted(CASES):
        target = args.out / name
        if args.stage in ("all", "train") and not (target / "checkpoint" / "rllib_checkpoint.json").is_file():
            target.mkdir(parents=True, exist_ok=True)
            train(name, target)
        if args.stage == "all":  # the answers come from a fresh process, as RLlib's users restore
            subprocess.run([sys.executable, __file__, str(args.out), name, "--stage", "answer"], check=True)
        elif args.stage == "answer":
            answer(name, target)
        print(f"recorded {target}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
