"""Train a small two-policy PPO (old API stack) on a PettingZoo game with real RLlib, save its
checkpoint and record RLlib's answers for every agent through whole episodes.

Not part of rlserve: it needs ray and pettingzoo (run it with a separate environment, never
the project's), e.g.

    python -m venv /tmp/rayenv && /tmp/rayenv/bin/pip install "ray[rllib]==2.60.0" torch pettingzoo
    /tmp/rayenv/bin/python scripts/record_rllib_multiagent.py tests/fixtures/checkpoints/ppo_rps_multiagent

The game is PettingZoo's rock-paper-scissors (``pettingzoo.classic.rps_v2``, parallel API:
two players, each observing the other's last move as ``Discrete(4)``, actions
``Discrete(3)``, 15 steps an episode). ``player_0`` is played by policy ``p0``, an LSTM that
also reads its previous reward; ``player_1`` by ``p1``, a feed-forward MLP
(``policy_mapping_fn``: ``"p0" if agent_id == "player_0" else "p1"``, code RLlib keeps only
as a pickled function; ``reference.json`` records it as data in rlserve's mapping form).

OUT_DIR gets the layout of ``shared/oracle/checkpoints/<case>/``:

    checkpoint/          the Algorithm checkpoint as RLlib wrote it (policies/p0, policies/p1)
    reference.json       case, env, mapping, per policy its model overrides and ``fixed``
                         answers; ``episodes``: whole episodes, per step and agent
    episode_states.npz   the recurrent policy's state in and out per episode step

The answers come from the checkpoint as RLlib reloads it (``Algorithm.from_checkpoint``):

- ``fixed[policy]``: every observation (0..3) fed alone from the initial state with zero
  previous action/reward, ``explore=False``: ``action``, ``dist_inputs``, ``value``, ``logp``;
- ``episodes``: each step answered per agent twice from the same inputs (its own policy,
  its own state, previous action and reward), with ``explore=False`` (``action``,
  ``dist_inputs``, ``value``, ``logp``) and with ``explore=True`` (the sampled ``taken_action``,
  ``taken_logp``); the game steps with the taken actions, and each agent's taken action
  and reward become its next step's previous action and reward, as RLlib's samplers feed them.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
from record_rllib_checkpoint import relative_paths, to_list  # the sibling script: same files, same JSON

ENV_NAME = "pettingzoo_rps_v2_parallel"
MAPPING = {"agents": {"player_0": "p0", "player_1": "p1"}, "patterns": [], "default": None}
MODELS = {
    # Not lstm_use_prev_action: with a Discrete action space RLlib 2.60's LSTMWrapper sizes its
    # LSTM with gymnasium's numpy integer (Discrete.n), which torch 2.13's nn.LSTM refuses.
    "p0": {"use_lstm": True, "lstm_cell_size": 16, "lstm_use_prev_reward": True, "fcnet_hiddens": [16],
           "max_seq_len": 10},
    "p1": {"fcnet_hiddens": [16, 16]},
}


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--episodes", type=int, default=2)
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args()


def _env_class():
    from pettingzoo.classic import rps_v2
    from ray.rllib.env.multi_agent_env import MultiAgentEnv

    class RockPaperScissors(MultiAgentEnv):
        """PettingZoo's parallel rock-paper-scissors as an RLlib MultiAgentEnv (the game as is)."""

        def __init__(self, config=None):
            super().__init__()
            self.env = rps_v2.parallel_env()
            self.possible_agents = list(self.env.possible_agents)
            self.agents = list(self.possible_agents)
            self.observation_spaces = {a: self.env.observation_space(a) for a in self.possible_agents}
            self.action_spaces = {a: self.env.action_space(a) for a in self.possible_agents}

        def reset(self, *, seed=None, options=None):
            obs, infos = self.env.reset(seed=seed, options=options)
            self.agents = list(self.env.agents)
            return obs, infos

        def step(self, actions):
            obs, rewards, terminated, truncated, infos = self.env.step(actions)
            self.agents = list(self.env.agents)
            terminated["__all__"] = all(terminated.values())
            truncated["__all__"] = all(truncated.values())
            return obs, rewards, terminated, truncated, infos

    return RockPaperScissors


def _config(args: argparse.Namespace):
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.policy.policy import PolicySpec
    from ray.tune.registry import register_env

    env_class = _env_class()
    probe = env_class()
    obs_space, act_space = probe.observation_spaces["player_0"], probe.action_spaces["player_0"]
    policies = {pid: PolicySpec(observation_space=obs_space, action_space=act_space, config={"model": model})
                for pid, model in MODELS.items()}
    # Registered by name: a class in the config would be pickled by value into every policy
    # state, the PettingZoo module it reads with it (a checkpoint is code-free data this way).
    register_env(ENV_NAME, lambda env_config: env_class(env_config))
    return (
        PPOConfig()
        .api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False)
        .environment(ENV_NAME)
        .framework("torch")
        .env_runners(num_env_runners=0, rollout_fragment_length="auto")
        .multi_agent(policies=policies,
                     policy_mapping_fn=lambda agent_id, *args, **kwargs: "p0" if agent_id == "player_0" else "p1")
        .training(train_batch_size=400, minibatch_size=100, num_epochs=2)
        .debugging(seed=args.seed, log_level="ERROR")
    ), env_class


def _strip_optimizer(checkpoint: Path) -> None:
    from ray import cloudpickle as pickle

    for state_file in checkpoint.glob("policies/*/policy_state.pkl"):
        state = pickle.loads(state_file.read_bytes())
        state["_optimizer_variables"] = []
        state_file.write_bytes(pickle.dumps(state))


class Answerer:
    """One policy of the restored algorithm, answered the way the old stack's samplers ask."""

    def __init__(self, algo, policy_id: str):
        import torch

        self.torch, self.algo, self.policy_id = torch, algo, policy_id
        self.policy = algo.get_policy(policy_id)

    def initial_state(self) -> list[np.ndarray]:
        return [np.asarray(s, np.float32) for s in self.policy.get_initial_state()]

    def step(self, obs, state, prev_action, prev_reward, explore: bool):
        return self.algo.compute_single_action(
            obs, state=state or None, prev_action=prev_action, prev_reward=prev_reward, policy_id=self.policy_id,
            explore=explore, full_fetch=True, unsquash_action=False, clip_action=False)

    def logp(self, dist_inputs, action) -> float:
        torch = self.torch
        dist = self.policy.dist_class(torch.as_tensor(np.asarray(dist_inputs)[None]), self.policy.model)
        return float(dist.logp(torch.as_tensor(np.asarray(action)[None])).numpy()[0])


def _record_fixed(rec: Answerer) -> dict:
    out: dict = {k: [] for k in ("obs", "action", "dist_inputs", "value", "logp")}
    for obs in range(4):
        action, _, extra = rec.step(obs, rec.initial_state(), 0, 0.0, explore=False)
        for key, value in (("obs", obs), ("action", action), ("dist_inputs", extra["action_dist_inputs"]),
                           ("value", extra["vf_preds"]), ("logp", rec.logp(extra["action_dist_inputs"], action))):
            out[key].append(value)
    return out


def _record_episode(answerers: dict, env, seed: int) -> tuple[list[dict], dict]:
    """One whole episode; per step per agent its inputs and answers."""
    obs, _ = env.reset(seed=seed)
    states = {a: answerers[a].initial_state() for a in obs}
    prev = {a: (0, 0.0) for a in obs}
    steps, recurrent = [], {}
    while env.agents:
        record, taken = {}, {}
        for agent in env.agents:
            rec = answerers[agent]
            prev_action, prev_reward = prev[agent]
            action, state_out, extra = rec.step(obs[agent], states[agent], prev_action, prev_reward, explore=False)
            sampled, _, sampled_extra = rec.step(obs[agent], states[agent], prev_action, prev_reward, explore=True)
            taken[agent] = int(sampled)
            record[agent] = {
                "policy": rec.policy_id, "obs": int(obs[agent]), "prev_action": int(prev_action),
                "prev_reward": float(prev_reward), "action": int(action),
                "dist_inputs": extra["action_dist_inputs"], "value": float(extra["vf_preds"]),
                "logp": rec.logp(extra["action_dist_inputs"], action), "taken_action": int(sampled),
                "taken_logp": float(sampled_extra["action_logp"])}
            if states[agent]:
                for i, (s_in, s_out) in enumerate(zip(states[agent], state_out, strict=True)):
                    recurrent.setdefault(f"{agent}/state_in/{i}", []).append(np.asarray(s_in, np.float32))
                    recurrent.setdefault(f"{agent}/state_out/{i}", []).append(np.asarray(s_out, np.float32))
                states[agent] = [np.asarray(s, np.float32) for s in state_out]
        obs, rewards, terminated, truncated, _ = env.step(taken)
        for agent in record:
            record[agent]["reward"] = float(rewards[agent])
            record[agent]["done"] = bool(terminated[agent] or truncated[agent])
            prev[agent] = (taken[agent], float(rewards[agent]))
        steps.append(record)
    return steps, recurrent


def main() -> None:
    args = _parse()
    import ray
    from ray.rllib.algorithms.algorithm import Algorithm

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    config, env_class = _config(args)
    algo = config.build()
    for _ in range(args.iterations):
        algo.train()
    args.out.mkdir(parents=True, exist_ok=True)
    checkpoint = (args.out / "checkpoint").resolve()  # RLlib's storage wants an absolute path
    if checkpoint.exists():
        shutil.rmtree(checkpoint)
    algo.save(str(checkpoint))
    algo.stop()
    _strip_optimizer(checkpoint)
    relative_paths(checkpoint)

    algo = Algorithm.from_checkpoint(str(checkpoint))
    answerers = {pid: Answerer(algo, pid) for pid in MODELS}
    env = env_class().env
    episodes, states = [], {}
    for number in range(args.episodes):
        steps, recurrent = _record_episode({"player_0": answerers["p0"], "player_1": answerers["p1"]}, env,
                                           args.seed + number)
        episodes.append({"env_seed": args.seed + number, "steps": steps})
        states.update({f"episode_{number}/{k}": np.stack(v) for k, v in recurrent.items()})
    reference = {
        "case": args.out.name, "env": "pettingzoo.classic.rps_v2.parallel_env()", "multi_agent": True,
        "mapping": MAPPING, "mapping_fn": "lambda agent_id, *args, **kwargs: 'p0' if agent_id == 'player_0' else 'p1'",
        "policies": {pid: {"model_overrides": model, "recurrent": bool(model.get("use_lstm"))}
                     for pid, model in MODELS.items()},
        "fixed": {pid: _record_fixed(rec) for pid, rec in answerers.items()},
        "episodes": episodes,
        "ray_version": ray.__version__,
    }
    (args.out / "reference.json").write_text(json.dumps(to_list(reference)))
    np.savez(args.out / "episode_states.npz", **states)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
