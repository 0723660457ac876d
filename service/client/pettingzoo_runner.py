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

With ``stream=True`` each episode is one stream (``AgentsClient.stream``: a WebSocket bound
to the episode, one message per environment step); the steps sent are the same as over HTTP,
so a seeded episode plays the same actions either way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rlserve.client.agents_client import AgentsClient, AgentsStream
from rlserve.client.gym_runner import _jsonable


@dataclass
class MultiAgentEpisode:
    """One played episode: each agent's summed reward, the steps, and the actions taken per step."""

    returns: dict[str, float]
    steps: int
    actions: list[dict[str, Any]] = field(default_factory=list)


class _HttpEpisode:
    """``AgentsClient``'s episode API bound to one episode id (a stream's has none: it is one)."""

    def __init__(self, client: AgentsClient, seed: int | None):
        self.client, self.id = client, client.start_episode(seed=seed)

    def get_actions(self, observations: Mapping[str, Any]) -> dict[str, Any]:
        return self.client.get_actions(self.id, observations)

    def log_returns(self, rewards: Mapping[str, float]) -> None:
        self.client.log_returns(self.id, rewards)

    def agents_done(self, agent_ids: Iterable[str], *, observations: Mapping[str, Any] | None = None,
                    truncated: bool = False) -> None:
        self.client.agents_done(self.id, agent_ids, observations=observations, truncated=truncated)

    def end_episode(self, observations: Mapping[str, Any] | None = None, *,
                    truncated: bool = False) -> dict[str, float]:
        return self.client.end_episode(self.id, observations, truncated=truncated)


def play_parallel_episode(client: AgentsClient, env: Any, *, seed: int | None = None,
                          env_seed: int | None = None, max_steps: int = 100_000,
                          stream: bool = False, binary: bool = False) -> MultiAgentEpisode:
    """Play one episode of the PettingZoo ``ParallelEnv`` ``env`` to its end. ``seed`` seeds
    the server's samplers (with the same ``env_seed`` the episode replays exactly);
    ``stream`` plays it over one stream (``binary``: msgpack frames) instead of HTTP requests."""
    observations, _ = env.reset(seed=env_seed)
    episode: _HttpEpisode | AgentsStream = client.stream(seed=seed, binary=binary) if stream \
        else _HttpEpisode(client, seed)
    taken: list[dict[str, Any]] = []
    steps = 0
    cut: dict[str, Any] = {}  # agents still playing at max_steps: their episodes are truncated there
    try:
        while env.agents and steps < max_steps:
            playing = {agent: _jsonable(observations[agent]) for agent in env.agents}
            actions = episode.get_actions(playing)
            taken.append(actions)
            observations, rewards, terminations, truncations, _ = env.step(actions)
            episode.log_returns(rewards)
            last = {agent: _jsonable(obs) for agent, obs in observations.items()}
            episode.agents_done([a for a in rewards if terminations.get(a)], observations=last)
            episode.agents_done([a for a in rewards if truncations.get(a) and not terminations.get(a)],
                                observations=last, truncated=True)
            steps += 1
        cut = {agent: _jsonable(observations[agent]) for agent in env.agents if agent in observations}
    finally:
        returns = episode.end_episode(cut, truncated=True)
    return MultiAgentEpisode(returns, steps, taken)


def play_parallel_episodes(client: AgentsClient, make_env: Callable[[], Any], episodes: int, *,
                           seed: int | None = None, env_seed: int = 0, stream: bool = False,
                           binary: bool = False) -> list[MultiAgentEpisode]:
    """``episodes`` episodes, each in a fresh environment; episode ``i`` uses ``seed + i`` and
    ``env_seed + i`` (no server seed when ``seed`` is None); ``stream``: one stream each."""
    played = []
    for i in range(episodes):
        env = make_env()
        try:
            played.append(play_parallel_episode(client, env, seed=None if seed is None else seed + i,
                                                env_seed=env_seed + i, stream=stream, binary=binary))
        finally:
            env.close()
    return played

