"""Train small RLlib policies whose module is one of RLlib's own example RLModule classes
(``ray.rllib.examples.rl_modules.classes``), save their checkpoints and record RLlib's answers.

Not part of rlserve: it needs ray (a separate environment, never the project's), e.g.

    python3 -m venv /tmp/rayenv && /tmp/rayenv/bin/pip install "ray[rllib]==2.60.0" torch==2.13.0 msgpack msgpack-numpy
    /tmp/rayenv/bin/python scripts/record_custom_modules.py tests/fixtures/custom-modules [CASE ...]

Each case folder gets the format of ``shared/oracle/custom-modules/`` (whose README points to
``shared/oracle/newstack/README.md`` (a)): ``checkpoint/`` (as RLlib saved it, this
repository's absolute path in the pickles replaced by a relative one of the same length),
``reference.json`` (case fields, ``layout``, ``modules.<id>`` with the module class,
distribution classes and initial state, both connector pipelines, ``crosscheck``, ``fixed``
and, for stateful modules, ``episode``), ``reference.npz`` and ``episode_states.npz``.

The answers come from a fresh process (``--stage answer``) that restores the checkpoint with
``Algorithm.from_checkpoint``: ``fixed`` feeds each of 100 observations (env seed 11, random
actions) alone from a fresh episode through the restored EnvRunner's env-to-module pipeline,
its module's ``forward_inference`` and its module-to-env pipeline (``explore=False``);
``episode`` is ``EnvRunner.sample(num_episodes=1, explore=True)`` itself (env seed 103,
``torch.manual_seed(103)``), captured around its pipelines and module, with the full module's
replay beside it. The drivers, layout and pipeline readers are in custom_module_answers.py,
newstack_layout.py and newstack_restored.py; the training helpers in record_newstack_cases.py.
The image env and the multi-agent mapping function stay in this script: RLlib pickles them
by value from ``__main__`` into the checkpoint.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from custom_module_answers import MultiDriver, crosscheck_sample, module_info
from custom_module_episode import fixed_multi, fixed_single, npz_arrays, policy_mapping, record_episode
from newstack_json import _jsonable, externalize
from newstack_layout import layout, pipeline_json
from record_newstack_cases import _init_ray, scrub_paths

# --------------------------------------------------------------------------- environment


class TinyFramesEnv(gym.Env):
    """Atari-like observations for ``TinyAtariCNN``: 4 stacked 42x42 grey frames as float32
    in [-1, 1] (uint8 / 128 - 1, as RLlib's ``NormalizedImageEnv`` makes them), a 4x4 ball
    moving on a black background; reward 1 for the action that names its horizontal
    direction (0 left, 1 still, 2 right)."""

    def __init__(self, config=None):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (42, 42, 4), np.float32)
        self.action_space = gym.spaces.Discrete(3)

    def _frame(self) -> np.ndarray:
        frame = np.zeros((42, 42), np.uint8)
        x, y = self._pos
        frame[y:y + 4, x:x + 4] = 255
        return frame

    def _move(self) -> None:
        if self._t % 10 == 0:
            self._vel = self.np_random.integers(-2, 3, 2)
        pos = self._pos + self._vel
        for i in range(2):
            if not 0 <= pos[i] <= 38:
                self._vel[i] = -self._vel[i]
        self._pos = np.clip(pos, 0, 38)
        self._frames = self._frames[1:] + [self._frame()]

    def _obs(self) -> np.ndarray:
        return np.stack(self._frames, -1).astype(np.float32) / 128.0 - 1.0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        self._pos = self.np_random.integers(0, 39, 2)
        self._frames = [self._frame()] * 4
        self._move()
        return self._obs(), {}

    def step(self, action):
        reward = float(int(action) == int(np.sign(self._vel[0])) + 1)
        self._t += 1
        self._move()
        return self._obs(), reward, False, self._t >= 40, {}


def agent_to_module(agent_id, episode, **kwargs):
    return f"p{agent_id}"


# --------------------------------------------------------------------------- cases

_PPO = {"train_batch_size_per_learner": 500, "minibatch_size": 100, "num_epochs": 2, "lr": 3e-4}
_CLASSES = "ray.rllib.examples.rl_modules.classes"
# "module": (file in ray.rllib.examples.rl_modules.classes, class name); "env": a gym id, a
# class of this script, or "<module>:<class>" of RLlib's examples.
CASES: dict[str, dict[str, Any]] = {
    # the shipped case, re-recorded only to compare the format (shared/oracle/custom-modules)
    "ppo_action_masking": {
        "algo": "PPO", "env": "ray.rllib.examples.envs.classes.action_mask_env:ActionMaskEnv",
        "env_config": "action_mask", "module": ("action_masking_rlm", "ActionMaskingTorchRLModule"),
        "model": {"fcnet_hiddens": [32, 32], "head_fcnet_hiddens": [16]},
        "training": {"train_batch_size": 1000, "minibatch_size": 200, "num_epochs": 4, "lr": 3e-4}},
    "ppo_lstm_containing": {
        "algo": "PPO", "env": "CartPole-v1", "module": ("lstm_containing_rlm", "LSTMContainingRLModule"),
        "model": {"lstm_cell_size": 16, "dense_layers": [32, 32], "max_seq_len": 20}, "training": _PPO},
    "ppo_tiny_atari_cnn": {
        "algo": "PPO", "env": "TinyFramesEnv", "module": ("tiny_atari_cnn_rlm", "TinyAtariCNN"),
        "model": {"conv_filters": [[8, 4, 2, "same"], [16, 4, 2, "same"], [32, 11, 1, "valid"]]},
        "training": _PPO},
    "vpg_cartpole": {
        "algo": "VPG", "env": "CartPole-v1", "module": ("vpg_torch_rlm", "VPGTorchRLModule"),
        "model": {"hidden_dim": 64}, "training": {"num_episodes_per_train_batch": 10, "lr": 1e-3}, "iterations": 3},
    "vpg_shared_encoder": {
        "algo": "VPG", "env": "ray.rllib.examples.envs.classes.multi_agent:MultiAgentCartPole",
        "env_config": {"num_agents": 2}, "multi_agent": "shared_encoder",
        "model": {"embedding_dim": 64, "hidden_dim": 64},
        "training": {"train_batch_size": 2048, "lr": 1e-2}, "iterations": 3},
    "ppo_custom_action_dist": {
        "algo": "PPO", "env": "CartPole-v1",
        "module": ("custom_action_distribution_rlm", "CustomActionDistributionRLModule"),
        "model": {"hidden_dim": 32, "action_dist_temperature": 5.0}, "training": _PPO},
    "ppo_autoregressive_actions": {
        "algo": "PPO", "env": "ray.rllib.examples.envs.classes.correlated_actions_env:CorrelatedActionsEnv",
        "module": ("autoregressive_actions_rlm", "AutoregressiveActionsRLM"), "model": {}, "training": _PPO},
}
FORMAT_CHECK_ONLY = {"ppo_action_masking"}  # recorded only when named on the command line


def _env_class(spec: dict[str, Any]) -> Any:
    env = spec["env"]
    if env in globals() and isinstance(globals()[env], type):
        return globals()[env]
    if ":" in env:
        module, name = env.split(":")
        return getattr(importlib.import_module(module), name)
    return env


def _env_config(spec: dict[str, Any]) -> dict[str, Any]:
    if spec.get("env_config") == "action_mask":  # the shipped case's spaces
        return {"action_space": gym.spaces.Discrete(100), "observation_space": gym.spaces.Box(-1.0, 1.0, (5,))}
    return dict(spec.get("env_config", {}))


def make_env(spec: dict[str, Any]) -> gym.Env:
    cls = _env_class(spec)
    return gym.make(cls) if isinstance(cls, str) else cls(_env_config(spec))


def _module_class(spec: dict[str, Any]) -> type:
    file, name = spec["module"]
    return getattr(importlib.import_module(f"{_CLASSES}.{file}"), name)


def _shared_encoder_spec(spec: dict[str, Any]):
    """RLlib's examples/multi_agent/shared_encoder_cartpole.py's MultiRLModuleSpec."""
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.examples.rl_modules.classes import vpg_using_shared_encoder_rlm as rlm

    single = gym.make("CartPole-v1")
    policy = {"embedding_dim": spec["model"]["embedding_dim"], "hidden_dim": spec["model"]["hidden_dim"]}
    return MultiRLModuleSpec(multi_rl_module_class=rlm.VPGMultiRLModuleWithSharedEncoder, rl_module_specs={
        rlm.SHARED_ENCODER_ID: RLModuleSpec(module_class=rlm.SharedEncoder,
                                            model_config={"embedding_dim": spec["model"]["embedding_dim"]},
                                            observation_space=single.observation_space,
                                            action_space=single.action_space),
        "p0": RLModuleSpec(module_class=rlm.VPGPolicyAfterSharedEncoder, model_config=dict(policy)),
        "p1": RLModuleSpec(module_class=rlm.VPGPolicyAfterSharedEncoder, model_config=dict(policy))})


def _config(spec: dict[str, Any]):
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.examples.algorithms.classes.vpg import VPGConfig

    config = {"PPO": PPOConfig, "VPG": VPGConfig}[spec["algo"]]()
    config.environment(_env_class(spec), env_config=_env_config(spec))
    config.env_runners(num_env_runners=0)
    training = dict(spec["training"])
    if spec.get("multi_agent") == "shared_encoder":
        from ray.rllib.examples.learners.classes.vpg_torch_learner_shared_optimizer import (
            VPGTorchLearnerSharedOptimizer,
        )

        training["learner_class"] = VPGTorchLearnerSharedOptimizer
        config.multi_agent(policies={"p0", "p1"}, policy_mapping_fn=agent_to_module)
        config.rl_module(rl_module_spec=_shared_encoder_spec(spec))
    else:
        config.rl_module(rl_module_spec=RLModuleSpec(module_class=_module_class(spec), model_config=spec["model"]))
    config.training(**training)
    config.debugging(seed=1234, log_level="ERROR")
    return config


def train(name: str, out: Path) -> list[float]:
    spec = CASES[name]
    _init_ray()
    algo = _config(spec).build_algo()
    returns = []
    for _ in range(spec.get("iterations", 2)):
        result = algo.train()
        returns.append(float(result.get("env_runners", {}).get("episode_return_mean", float("nan"))))
    algo.save_to_path(str((out / "checkpoint").resolve()))
    algo.stop()
    scrub_paths(out / "checkpoint")
    scrub_site_packages(out / "checkpoint")
    return returns


def scrub_site_packages(checkpoint: Path) -> None:
    """RLlib code pickled by value (``MultiAgentCartPole`` is a class ``make_multi_agent``
    makes inside a function) carries the environment's absolute source path: the part before
    ``site-packages/`` becomes underscores of the same length, as in the shared cases."""
    import ray

    site = Path(ray.__file__).parents[1]
    prefixes = {(str(p.parent) + "/").encode() for p in (site, site.resolve())}
    for path in checkpoint.rglob("*.pkl"):
        data = path.read_bytes()
        for prefix in prefixes:
            data = data.replace(prefix + b"site-packages/", b"_" * len(prefix) + b"site-packages/")
        path.write_bytes(data)


# --------------------------------------------------------------------------- answers

def _case_fields(name: str, spec: dict[str, Any], driver: Any, module_ids: list[str]) -> dict[str, Any]:
    import ray
    import torch

    cls = _env_class(spec)
    return {
        "case": name, "algo": spec["algo"], "env": cls if isinstance(cls, str) else cls.__name__,
        "multi_agent": bool(spec.get("multi_agent")), "module_ids": module_ids,
        "ray_version": ray.__version__, "torch_version": torch.__version__,
        "model_config_overrides": spec["model"], "env_to_module_user_connectors": [],
        "env_to_module_user_connector_kwargs": {}, "training_overrides": {},
        "msgpack_checkpoint": False, "normalize_actions": True, "clip_actions": False,
    }


def answer(name: str, out: Path, count: int = 100, steps: int = 30) -> None:
    from custom_module_answers import ModuleDriver

    spec = CASES[name]
    checkpoint = out / "checkpoint"
    _init_ray()
    multi = bool(spec.get("multi_agent"))
    driver = MultiDriver(checkpoint) if multi else ModuleDriver(checkpoint)
    rl_dir = checkpoint / "learner_group" / "learner" / "rl_module"
    if multi:
        module_ids = sorted(driver.module.keys())
        modules = {mid: module_info(driver.runner.module[mid], driver.module[mid], rl_dir / mid) for mid in module_ids}
    else:
        module_ids = ["default_policy"]
        modules = {"default_policy": module_info(driver.runner.module, driver.module, rl_dir / "default_policy")}
    reference = _case_fields(name, spec, driver, module_ids)
    if multi:
        reference["multi_rl_module_class"] = f"{type(driver.module).__module__}.{type(driver.module).__qualname__}"
    reference.update(layout=layout(checkpoint), modules=modules,
                     env_to_module_pipeline=pipeline_json(driver.runner._env_to_module),
                     module_to_env_pipeline=pipeline_json(driver.runner._module_to_env),
                     recurrent=any(m["is_stateful"] for m in modules.values()))
    env = make_env(spec)
    fixed, extras = (fixed_multi if multi else fixed_single)(driver, env, count)
    if multi:
        reference["policy_mapping"] = policy_mapping(driver, checkpoint, env)
    reference["crosscheck"] = {**extras, "vs_env_runner_sample_explore_false": crosscheck_sample(driver)}
    reference["fixed"] = fixed
    states: dict[str, np.ndarray] = {}
    if reference["recurrent"]:
        reference["episode"], states = record_episode(driver, steps)
    np.savez_compressed(out / "reference.npz", **npz_arrays(fixed))
    if states:
        np.savez_compressed(out / "episode_states.npz", **states)
    (out / "reference.json").write_text(json.dumps(externalize(_jsonable(reference))))
    driver.algo.stop()


def _summarize(out: Path, name: str, returns: list[float]) -> None:
    """summary.json beside the case folders: each case's training settings and returns."""
    spec = CASES[name]
    path = out / "summary.json"
    summary = json.loads(path.read_text()) if path.is_file() else {}
    module = spec.get("module", ["vpg_using_shared_encoder_rlm", "(MultiRLModuleSpec)"])
    summary[name] = {"train": {"algo": spec["algo"], "env": spec["env"], "env_config": str(_env_config(spec)),
                               "module": list(module),
                               "model_config": spec["model"], "training": _jsonable(
                                   {k: getattr(v, "__name__", v) for k, v in spec["training"].items()}),
                               "iterations": spec.get("iterations", 2), "seed": 1234, "num_env_runners": 0,
                               "episode_return_mean_per_iteration": returns}}
    path.write_text(json.dumps(dict(sorted(summary.items())), indent=1) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("cases", nargs="*", help=f"default: all of {sorted(set(CASES) - FORMAT_CHECK_ONLY)}")
    p.add_argument("--stage", choices=("all", "train", "answer"), default="all")
    args = p.parse_args()
    for name in args.cases or sorted(set(CASES) - FORMAT_CHECK_ONLY):
        target = args.out / name
        if args.stage in ("all", "train") and not (target / "checkpoint" / "rllib_checkpoint.json").is_file():
            target.mkdir(parents=True, exist_ok=True)
            returns = train(name, target)
            print(f"{name}: episode_return_mean per iteration {returns}", flush=True)
            _summarize(args.out, name, returns)
        if args.stage == "all":  # the answers come from a fresh process, as RLlib's users restore
            subprocess.run([sys.executable, __file__, str(args.out), name, "--stage", "answer"], check=True)
        elif args.stage == "answer":
            answer(name, target)
        print(f"recorded {target}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
