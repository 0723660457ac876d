"""Run gymnasium episodes against a served policy.

Several environments step in lock-step and share one batched act call per step
(``act_batch`` with one session per environment), the way a vectorised simulator would
talk to the service. Each environment's episode is one server session, so recurrent
state lives on the server; ``reset_state_every_step`` marks every step as an episode
start, which zeroes that state (the control experiment for memory policies).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from rlserve.client.policy_client import PolicyClient


@dataclass
class EpisodeStats:
    """The returns and lengths of the episodes ``run_episodes`` played, in the order they were played."""

    returns: list[float]
    lengths: list[int]

    @property
    def mean_return(self) -> float:
        """The average return (NaN when no episode was played)."""
        return float(np.mean(self.returns)) if self.returns else float("nan")


def _jsonable(observation: object) -> object:
    if isinstance(observation, np.ndarray):
        return observation.tolist()
    if isinstance(observation, dict):
        return {k: _jsonable(v) for k, v in observation.items()}
    if isinstance(observation, tuple | list):
        return [_jsonable(v) for v in observation]
    if isinstance(observation, np.generic):
        return observation.item()
    return observation


def run_episodes(
    client: PolicyClient,
    make_env: Callable[[], gym.Env],
    episodes: int,
    *,
    parallel: int = 1,
    seed: int = 0,
    explore: bool = False,
    reset_state_every_step: bool = False,
    max_steps: int = 10_000,
    sessions: bool = True,
    stream: bool = False,
) -> EpisodeStats:
    """Play ``episodes`` episodes, ``parallel`` environments at a time; returns their returns.

    Each step of a group is one ``act_batch`` call with one server session per environment
    (seeded with the environment's seed: ``seed``, ``seed + 1``, ...), so the recurrent
    state lives on the server; a finished episode's session is ended. ``explore=False``
    takes the deterministic action; ``reset_state_every_step=True`` starts every step as a
    new episode on the server (what a memory policy scores without memory). An episode is
    cut after ``max_steps``. ``sessions=False`` plays without server sessions (stateless
    requests): right for a policy without memory on a server that keeps none (``--workers
    N`` without a store). ``stream=True`` plays each environment over a stream of its own
    (``PolicyClient.stream``, one WebSocket per environment) instead of batched HTTP calls.
    """
    if stream and (reset_state_every_step or not sessions):
        raise ValueError("stream=True plays one session per environment: no reset_state_every_step, sessions=True")
    if episodes < 1 or parallel < 1:
        raise ValueError(f"episodes and parallel must be >= 1, got {episodes} and {parallel}")
    stats = EpisodeStats(returns=[], lengths=[])
    next_seed = seed
    while len(stats.returns) < episodes:
        n = min(parallel, episodes - len(stats.returns))
        envs = [make_env() for _ in range(n)]
        try:
            group_seeds = list(range(next_seed, next_seed + n))
            if stream:
                returns, lengths = _play_streams(client, envs, group_seeds, explore, max_steps)
            else:
                returns, lengths = _play_group(client, envs, group_seeds, explore, reset_state_every_step,
                                               max_steps, sessions)
        finally:
            for env in envs:
                env.close()
        next_seed += n
        stats.returns.extend(returns)
        stats.lengths.extend(lengths)
    return stats


def _play_group(client: PolicyClient, envs: list[gym.Env], seeds: list[int], explore: bool,
                reset_every_step: bool, max_steps: int, sessions: bool = True) -> tuple[list[float], list[int]]:
    n = len(envs)
    observations = [env.reset(seed=s)[0] for env, s in zip(envs, seeds, strict=True)]
    session_ids = [f"run-{uuid.uuid4().hex[:12]}-{i}" for i in range(n)]
    returns, lengths = [0.0] * n, [0] * n
    rewards: list[float | None] = [None] * n
    done = [False] * n
    # 1 terminated, 2 truncated: the next call sends the episode's last observation (with
    # its reward and the flag, so the server's experience log closes the episode), then
    # the session ends; that call's action is not played.
    ending = [0] * n
    for step in range(max_steps + 1):
        live = [i for i in range(n) if not done[i]]
        if not live:
            break
        if step == max_steps:  # the runner's own step limit truncates what is still running
            if not sessions:
                break
            ending = [e or 2 for e in ending]
        rows = [_jsonable(observations[i]) for i in live]
        if not sessions:
            result = client.act_batch(rows, explore=explore)
        else:
            ends: dict[str, Any] = {"terminateds": [ending[i] == 1 for i in live],
                                    "truncateds": [ending[i] == 2 for i in live]} \
                if any(ending[i] for i in live) else {}
            result = client.act_batch(
                rows,
                session_ids=[session_ids[i] for i in live],
                episode_starts=[step == 0 or reset_every_step for _ in live],
                rewards=[None if step == 0 or reset_every_step else rewards[i] for i in live],
                # Seed once per episode; re-seeding at every reset would repeat the same draws.
                seeds=[seeds[i] if step == 0 else None for i in live],
                explore=explore,
                **ends,
            )
        for i, action in zip(live, result.actions, strict=True):
            if ending[i]:
                done[i] = True
                if sessions:
                    client.end_session(session_ids[i])
                continue
            end = _env_step(envs[i], i, action, observations, rewards, returns, lengths)
            if end:
                if sessions:
                    ending[i] = end
                else:  # no server episode to close
                    done[i] = True
    return returns, lengths


def _play_streams(client: PolicyClient, envs: list[gym.Env], seeds: list[int], explore: bool,
                  max_steps: int) -> tuple[list[float], list[int]]:
    """``_play_group`` with one stream per environment: every live stream gets its step
    before any answer is read, so the server can batch them as it batches one HTTP call."""
    n = len(envs)
    streams = [client.stream(seed=s, explore=explore) for s in seeds]
    try:
        observations = [env.reset(seed=s)[0] for env, s in zip(envs, seeds, strict=True)]
        returns, lengths = [0.0] * n, [0] * n
        rewards: list[float | None] = [None] * n
        ending, done = [0] * n, [False] * n  # ending: 1 terminated, 2 truncated (as in _play_group)
        for step in range(max_steps + 1):
            live = [i for i in range(n) if not done[i]]
            if not live:
                break
            if step == max_steps:
                ending = [e or 2 for e in ending]
            for i in live:
                streams[i].send(observations[i], reward=rewards[i], terminated=ending[i] == 1,
                                truncated=ending[i] == 2)
            for i in live:
                action = streams[i].receive().action
                if ending[i]:
                    done[i] = True
                    streams[i].end()
                    continue
                ending[i] = _env_step(envs[i], i, action, observations, rewards, returns, lengths)
    finally:
        for opened in streams:
            opened.close()
    return returns, lengths


def _env_step(env: gym.Env, i: int, action: Any, observations: list[Any], rewards: list[float | None],
              returns: list[float], lengths: list[int]) -> int:
    """Play ``action`` in environment ``i`` and book its outcome in the runners' per-env
    lists; the episode's end: 0 it goes on, 1 terminated, 2 truncated."""
    observations[i], reward, terminated, truncated, _ = env.step(action)
    rewards[i] = float(reward)
    returns[i] += float(reward)
    lengths[i] += 1
    return 1 if terminated else 2 if truncated else 0
