"""A small PPO (clipped surrogate, GAE) for feedforward and LSTM policies on CPU.

Both kinds go through one code path: the rollout stores the recurrent state each env
carried into every step, and the update replays fixed-length windows from those stored
states (truncated BPTT), zeroing the state where an episode starts inside a window. A
feedforward policy is the special case with no state and windows of length 1.

The model must provide ``initial_state(batch)`` and
``sequence(obs (B, T, D), state, starts (B, T)) -> (logits (B, T, A), value (B, T), state)``.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from training.evaluate import average_return


@dataclass(frozen=True)
class PPOConfig:
    total_steps: int = 100_000
    n_envs: int = 8
    n_steps: int = 32  # per env and update
    epochs: int = 20
    minibatches: int = 1
    seq_len: int = 1  # BPTT window; 1 for feedforward policies
    lr: float = 1e-3  # annealed linearly to 0, like the clip range
    gamma: float = 0.98
    gae_lambda: float = 0.8
    clip: float = 0.2
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    # Rewards are multiplied by this while training so value errors do not swamp the policy
    # gradient in the shared trunk; the value head is rescaled back to true returns afterwards.
    reward_scale: float = 1.0
    eval_every: int = 10  # updates between greedy evaluations (checkpoint selection)
    eval_episodes: int = 5
    target_return: float | None = None  # stop early once greedy and sampled evals reach it


@dataclass
class Rollout:
    obs: torch.Tensor  # (T, N, D)
    starts: torch.Tensor  # (T, N) 1.0 where obs[t] is an episode's first observation
    states: tuple[torch.Tensor, ...]  # each (T, N, C): state carried into step t
    actions: torch.Tensor  # (T, N)
    logp: torch.Tensor  # (T, N)
    values: torch.Tensor  # (T, N)
    rewards: torch.Tensor  # (T, N), truncation already bootstrapped
    dones: torch.Tensor  # (T, N)
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None


class VecEnv:
    """N environments stepped in a plain loop; an ended episode resets on the spot."""

    def __init__(self, make_env: Callable[[], gym.Env], n: int, seed: int):
        self.envs = [make_env() for _ in range(n)]
        self.obs = np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(self.envs)])
        self.starts = np.ones(n, dtype=np.float32)
        self.episode_returns = np.zeros(n)
        self.finished: list[float] = []

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[int, np.ndarray]]:
        """Returns rewards, terminated, done flags and the final obs of truncated episodes."""
        n = len(self.envs)
        rewards, terminated, done = np.zeros(n), np.zeros(n), np.zeros(n)
        truncated_obs: dict[int, np.ndarray] = {}
        for i, env in enumerate(self.envs):
            obs, r, term, trunc, _ = env.step(int(actions[i]))
            rewards[i], terminated[i], done[i] = r, term, term or trunc
            self.episode_returns[i] += r
            if term or trunc:
                if trunc and not term:
                    truncated_obs[i] = obs
                self.finished.append(self.episode_returns[i])
                self.episode_returns[i] = 0.0
                obs, _ = env.reset()
            self.obs[i] = obs
        self.starts = done.astype(np.float32)
        return rewards, terminated, done, truncated_obs


def _select(state: tuple[torch.Tensor, ...], idx: list[int]) -> tuple[torch.Tensor, ...]:
    return tuple(s[idx] for s in state)


@torch.no_grad()
def collect(model: nn.Module, venv: VecEnv, state: tuple, cfg: PPOConfig) -> tuple[Rollout, tuple]:
    T = cfg.n_steps
    buf = {k: [] for k in ("obs", "starts", "actions", "logp", "values", "rewards", "dones")}
    states: list[tuple[torch.Tensor, ...]] = []
    for _ in range(T):
        # Copies: the VecEnv overwrites its buffers in place on the next step.
        obs = torch.tensor(venv.obs, dtype=torch.float32)
        starts = torch.tensor(venv.starts)
        states.append(state)
        logits, value, state = model.sequence(obs.unsqueeze(1), state, starts.unsqueeze(1))
        dist = torch.distributions.Categorical(logits=logits[:, 0])
        action = dist.sample()
        rewards, _, done, truncated_obs = venv.step(action.numpy())
        rewards *= cfg.reward_scale
        if truncated_obs:  # time limit, not failure: bootstrap with V(final obs)
            idx = sorted(truncated_obs)
            last = torch.as_tensor(np.stack([truncated_obs[i] for i in idx]), dtype=torch.float32)
            _, v_last, _ = model.sequence(last.unsqueeze(1), _select(state, idx), None)
            rewards[idx] += cfg.gamma * v_last[:, 0].numpy()
        for k, v in (("obs", obs), ("starts", starts), ("actions", action), ("logp", dist.log_prob(action)),
                     ("values", value[:, 0]), ("rewards", torch.as_tensor(rewards, dtype=torch.float32)),
                     ("dones", torch.as_tensor(done, dtype=torch.float32))):
            buf[k].append(v)
    roll = Rollout(**{k: torch.stack(v) for k, v in buf.items()},
                   states=tuple(torch.stack(s) for s in zip(*states, strict=True)) if state else ())
    obs = torch.as_tensor(venv.obs, dtype=torch.float32).unsqueeze(1)
    _, last_value, _ = model.sequence(obs, state, torch.as_tensor(venv.starts).unsqueeze(1))
    _gae(roll, last_value[:, 0], cfg)
    return roll, state


def _gae(roll: Rollout, last_value: torch.Tensor, cfg: PPOConfig) -> None:
    adv = torch.zeros_like(roll.rewards)
    running = torch.zeros_like(last_value)
    for t in reversed(range(roll.rewards.shape[0])):
        next_value = last_value if t == roll.rewards.shape[0] - 1 else roll.values[t + 1]
        alive = 1.0 - roll.dones[t]
        delta = roll.rewards[t] + cfg.gamma * next_value * alive - roll.values[t]
        running = delta + cfg.gamma * cfg.gae_lambda * alive * running
        adv[t] = running
    roll.advantages, roll.returns = adv, adv + roll.values


def _windows(x: torch.Tensor, L: int) -> torch.Tensor:
    """(T, N, ...) -> (N * T / L, L, ...): consecutive steps of one env per window."""
    T, N = x.shape[:2]
    return x.transpose(0, 1).reshape(N * (T // L), L, *x.shape[2:])


def update(model: nn.Module, opt: torch.optim.Optimizer, roll: Rollout, cfg: PPOConfig, frac: float) -> dict:
    L = cfg.seq_len
    w = {k: _windows(getattr(roll, k), L) for k in ("obs", "starts", "actions", "logp", "advantages", "returns")}
    # The state carried into each window's first step, e.g. steps 0, L, 2L, ... of each env.
    s0 = tuple(_windows(s, L)[:, 0] for s in roll.states)
    n_windows = w["obs"].shape[0]
    clip = cfg.clip * frac
    stats: dict[str, float] = {}
    for _ in range(cfg.epochs):
        for idx in torch.randperm(n_windows).chunk(cfg.minibatches):
            logits, values, _ = model.sequence(w["obs"][idx], tuple(s[idx] for s in s0), w["starts"][idx])
            dist = torch.distributions.Categorical(logits=logits)
            logp = dist.log_prob(w["actions"][idx])
            adv = w["advantages"][idx]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            ratio = torch.exp(logp - w["logp"][idx])
            pg_loss = -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv).mean()
            v_loss = 0.5 * ((values - w["returns"][idx]) ** 2).mean()
            entropy = dist.entropy().mean()
            loss = pg_loss + cfg.vf_coef * v_loss - cfg.ent_coef * entropy
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            opt.step()
            stats = {"pg_loss": pg_loss.item(), "v_loss": v_loss.item(), "entropy": entropy.item()}
    return stats


def train(
    model: nn.Module, make_env: Callable[[], gym.Env], cfg: PPOConfig, seed: int, log: Callable[[dict], None]
) -> tuple[nn.Module, dict]:
    """Trains ``model`` in place; returns the best evaluated checkpoint and its scores."""
    torch.manual_seed(seed)
    assert cfg.n_steps % cfg.seq_len == 0, "n_steps must be a multiple of seq_len"
    venv = VecEnv(make_env, cfg.n_envs, seed)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, eps=1e-5)
    state = model.initial_state(cfg.n_envs)
    n_updates = cfg.total_steps // (cfg.n_envs * cfg.n_steps)
    best: tuple[tuple[float, float], nn.Module | None, dict] = ((-1.0, -1.0), None, {})
    t0 = time.perf_counter()
    for u in range(1, n_updates + 1):
        frac = 1.0 - (u - 1) / n_updates
        for group in opt.param_groups:
            group["lr"] = cfg.lr * frac
        roll, state = collect(model, venv, state, cfg)
        stats = update(model, opt, roll, cfg, frac)
        if u % cfg.eval_every and u != n_updates:
            continue
        recent = venv.finished[-20:]
        entry = {"update": u, "env_steps": u * cfg.n_envs * cfg.n_steps, "wall_s": round(time.perf_counter() - t0, 1),
                 "train_return_last20": float(np.mean(recent)) if recent else None, **stats}
        entry.update(_evaluate(model, make_env, cfg, seed))
        log(entry)
        # The weaker of the two modes first: a default policy must be good when sampled too.
        score = (min(entry["eval_greedy"], entry["eval_sampled"]), entry["eval_greedy"] + entry["eval_sampled"])
        if score >= best[0]:  # ties go to the later, longer-trained checkpoint
            best = (score, copy.deepcopy(model), entry)
        if cfg.target_return is not None and score[0] >= cfg.target_return:
            break
    return best[1], best[2]


def _evaluate(model: nn.Module, make_env: Callable[[], gym.Env], cfg: PPOConfig, seed: int) -> dict:
    # Episodes seeded away from the training envs so selection is not on training starts.
    state = model.initial_state(1)
    greedy, _ = average_return(model, make_env, state, cfg.eval_episodes, seed + 1000, sample=False)
    sampled, _ = average_return(model, make_env, state, cfg.eval_episodes, seed + 2000, sample=True)
    return {"eval_greedy": greedy, "eval_sampled": sampled}
