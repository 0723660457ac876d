"""Episode returns of a policy given as ``forward(obs, *state) -> (logits, value, *state)``.

That is the calling convention of the catalog's models (``models/interface.py``), so the
same loop scores the training modules, the eager catalog model and nothing else needs to
know which one it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import gymnasium as gym
import numpy as np
import torch

Forward = Callable[..., Sequence[torch.Tensor]]


@torch.no_grad()
def run_episode(
    forward: Forward,
    env: gym.Env,
    initial_state: Sequence[torch.Tensor],
    seed: int,
    sample: bool,
    reset_state_every_step: bool = False,
) -> float:
    """One episode; actions are argmax (``sample=False``) or drawn from softmax(logits).

    ``reset_state_every_step`` feeds the initial state at every step, i.e. removes memory.
    """
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    state = list(initial_state)
    total, done = 0.0, False
    while not done:
        if reset_state_every_step:
            state = list(initial_state)
        out = forward(torch.as_tensor(obs, dtype=torch.float32).unsqueeze(0), *state)
        logits, state = out[0][0].double().numpy(), list(out[2:])
        if sample:
            probs = np.exp(logits - logits.max())
            action = int(rng.choice(len(probs), p=probs / probs.sum()))
        else:
            action = int(np.argmax(logits))
        obs, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
        done = terminated or truncated
    return total


def average_return(
    forward: Forward,
    make_env: Callable[[], gym.Env],
    initial_state: Sequence[torch.Tensor],
    episodes: int,
    seed: int,
    sample: bool,
    reset_state_every_step: bool = False,
) -> tuple[float, list[float]]:
    """Mean and list of returns over ``episodes`` episodes seeded ``seed, seed+1, ...``."""
    env = make_env()
    returns = [
        run_episode(forward, env, initial_state, seed + i, sample, reset_state_every_step)
        for i in range(episodes)
    ]
    env.close()
    return float(np.mean(returns)), returns
