"""Play PettingZoo parallel environments against a served policy set.

PettingZoo's parallel API (``reset`` -> observations by agent; ``step(actions)`` ->
observations, rewards, terminations, truncations, infos by agent; ``env.agents`` the agents
still playing) is the standard interface of simultaneous-move multi-agent environments. Each
environment step is one ``AgentsClient.get_actions`` call for the agents still playing; the
server maps each to its policy and keeps each agent's state for the whole episode. Agents
that terminate or truncate finish (their state ends) with the next call, which sends their
last observation and reward (a server's experience log closes their episodes with it); the
episode ends when no agent is left. An action mask travels inside a Dict observation (RLlib's
``action_mask`` convention), which the server reads there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlserve.client.agents_client import AgentsClient
from rlserve.client.gym_runner import _jsonable


@dataclass
class MultiAgentEpisode:
    """One played episode: each agent's summed reward, the steps, and the actions taken per step."""

    returns: dict[str, float]
    steps: int
    actions: list[dict[str, Any]] = field(default_factory=list)


def play_parallel_episode(client: AgentsClient, env: Any, *, seed: int | None = None,
                          env_seed: int | None = None, max_steps: int = 100_000) -> MultiAgentEpisode:
    """Play one episode of the PettingZoo ``ParallelEnv`` ``env`` to its end. ``seed`` seeds
    the server's samplers (with the same ``env_seed`` the episode replays exactly)."""
    observations, _ = env.reset(seed=env_seed)
    episode_id = client.start_episode(seed=seed)
    taken: list[dict[str, Any]] = []
    steps = 0
    cut: dict[str, Any] = {}  # agents still playing at max_steps: their episodes are truncated there
    try:
        while env.agents and steps < max_steps:
            playing = {agent: _jsonable(observations[agent]) for agent in env.agents}
            actions = client.get_actions(episode_id, playing)
            taken.append(actions)
            observations, rewards, terminations, truncations, _ = env.step(actions)
            client.log_returns(episode_id, rewards)
            last = {agent: _jsonable(obs) for agent, obs in observations.items()}
            client.agents_done(episode_id, [a for a in rewards if terminations.get(a)], observations=last)
            client.agents_done(episode_id, [a for a in rewards if truncations.get(a) and not terminations.get(a)],
                               observations=last, truncated=True)
            steps += 1
        cut = {agent: _jsonable(observations[agent]) for agent in env.agents if agent in observations}
    finally:
        returns = client.end_episode(episode_id, cut, truncated=True)
    return MultiAgentEpisode(returns, steps, taken)


def play_parallel_episodes(client: AgentsClient, make_env: Callable[[], Any], episodes: int, *,
                           seed: int | None = None, env_seed: int = 0) -> list[MultiAgentEpisode]:
    """``episodes`` episodes, each in a fresh environment; episode ``i`` uses ``seed + i`` and
    ``env_seed + i`` (no server seed when ``seed`` is None)."""
    played = []
    for i in range(episodes):
        env = make_env()
        try:
            played.append(play_parallel_episode(client, env, seed=None if seed is None else seed + i,
                                                env_seed=env_seed + i))
        finally:
            env.close()
    return played

