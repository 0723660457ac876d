"""Python client for a policy set (multi-agent): one call per environment step, many agents.

Two layers, as for single policies (``policy_client``):

- ``act``: one ``POST /v1/models/{name}/agents/act``, the wire format as it is.
- The episode API: ``start_episode``, ``get_actions`` (the agents that act now, by agent
  id), ``log_returns`` (rewards by agent, summed and sent with each agent's next step),
  ``agents_done`` (agents that finished: their state ends with the next call, which also
  sends their last observations when given, so a server's experience log closes their
  episodes), and ``end_episode`` (every agent's state ends; returns each agent's summed reward).

Retries follow ``PolicyClient``'s rules (only where a repeat cannot change what the server did).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from rlserve.client.agents_episode import AgentsEpisode
from rlserve.client.agents_result import AgentsResult
from rlserve.client.agents_stream import AgentsStream, AsyncAgentsStream
from rlserve.client.policy_client import PolicyClient, SessionNotFoundError

__all__ = ["AgentsClient", "AgentsResult", "AgentsStream", "AsyncAgentsStream"]


class AgentsClient:
    """A policy set's client (sync, on httpx through ``PolicyClient``'s transport)."""

    def __init__(self, base_url: str, model: str, *, explore: bool | None = None, **kwargs: Any):
        """A client of the policy set ``model`` at ``base_url``; ``explore`` is the default of
        every step, and ``kwargs`` go to the underlying ``PolicyClient`` (timeouts, retries)."""
        self.model = model
        self.explore = explore
        self._http = PolicyClient(base_url, model, explore=explore, **kwargs)
        self._episodes: dict[str, AgentsEpisode] = {}

    def __enter__(self) -> AgentsClient:
        """Use it as a context manager; the connection closes on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the connection."""
        self.close()

    def close(self) -> None:
        """Close the HTTP connection (episodes on the server are not ended)."""
        self._http.close()

    @property
    def _path(self) -> str:
        return f"/v1/models/{self.model}/agents/act"

    def act(self, agents: Mapping[str, Mapping[str, Any]], *, episode_id: str | None = None,
            episode_start: bool = False, episode_end: bool = False, seed: int | None = None,
            explore: bool | None = None, outputs: Sequence[str] | None = None) -> AgentsResult:
        """One step: ``agents`` maps each agent id to its step (``observation``, and optionally
        ``action_mask``, ``reward``, ``prev_action``, ``done``, ``truncated``)."""
        body: dict[str, Any] = {"agents": {agent: dict(step) for agent, step in agents.items()}}
        for key, value in (("episode_id", episode_id), ("seed", seed), ("outputs", list(outputs or []) or None)):
            if value is not None:
                body[key] = value
        explore = self.explore if explore is None else explore
        if explore is not None:
            body["explore"] = explore
        if episode_start:
            body["episode_start"] = True
        if episode_end:
            body["episode_end"] = True
        return AgentsResult(self._http._request("POST", self._path, json=body))

    def stream(self, **options: Any) -> AgentsStream:
        """Open a stream of one episode (``seed``, ``outputs``, ``episode_id`` to resume,
        ``binary`` for msgpack frames; ``explore`` defaults to the client's)."""
        return AgentsStream(self._http.base_url, self.model, **self._stream_options(options))

    def async_stream(self, **options: Any) -> AsyncAgentsStream:
        """``stream`` for asyncio: ``async with client.async_stream(seed=1) as stream``."""
        return AsyncAgentsStream(self._http.base_url, self.model, **self._stream_options(options))

    def _stream_options(self, options: dict[str, Any]) -> dict[str, Any]:
        options.setdefault("explore", self.explore)
        return {"headers": self._http._headers, "timeout": self._http._timeout, **options}

    def model_info(self) -> dict[str, Any]:
        """The set's metadata: its agent-to-policy mapping and each member policy."""
        return self._http._request("GET", f"/v1/models/{self.model}", retry_on_timeout=True)

    # ------------------------------------------------------------------ the episode API

    def start_episode(self, episode_id: str | None = None, *, seed: int | None = None) -> str:
        """Open an episode here; it starts on the server with the first ``get_actions``."""
        episode_id = episode_id or uuid.uuid4().hex
        self._episodes[episode_id] = AgentsEpisode(episode_id, seed)
        return episode_id

    def get_actions(self, episode_id: str, observations: Mapping[str, Any], *,
                    action_masks: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The actions of the agents that act now (their observations by agent id); agents
        reported done since the last call finish with it."""
        episode = self._episode(episode_id)
        agents = episode.step_agents(observations, action_masks)
        result = self.act(agents, episode_id=episode_id, episode_start=not episode.started,
                          seed=episode.seed if not episode.started else None)
        episode.started = True
        return result.actions

    def log_returns(self, episode_id: str, rewards: Mapping[str, float]) -> None:
        """Rewards received since the agents' last actions (summed until sent)."""
        self._episode(episode_id).log_returns(rewards)

    def agents_done(self, episode_id: str, agent_ids: Iterable[str], *,
                    observations: Mapping[str, Any] | None = None, truncated: bool = False) -> None:
        """These agents finished: their state ends with the next call.

        ``observations`` (by agent id) are their last observations: the next call sends them
        with the rewards logged since, so the server's experience log closes each agent's
        episode there, as terminated, or truncated with ``truncated=True`` (a time limit).
        """
        self._episode(episode_id).finish(agent_ids, observations, truncated)

    def end_episode(self, episode_id: str, observations: Mapping[str, Any] | None = None, *,
                    truncated: bool = False) -> dict[str, float]:
        """End the episode on the server (every agent's state); returns each agent's summed reward.

        ``observations`` are the last observations of agents still playing (as in ``agents_done``).
        """
        episode = self._episodes.pop(episode_id, None)
        if episode is None:
            raise SessionNotFoundError(f"episode {episode_id!r} is not open", field="episode_id",
                                       received=episode_id)
        done = episode.last_agents(observations, truncated)
        if episode.started:
            if done:
                self.act(done, episode_id=episode_id, episode_end=True)
            else:
                self._http._request("DELETE", f"/v1/models/{self.model}/episodes/{quote(episode_id, safe='')}")
        return dict(episode.returns)

    def _episode(self, episode_id: str) -> AgentsEpisode:
        try:
            return self._episodes[episode_id]
        except KeyError:
            raise SessionNotFoundError(f"episode {episode_id!r} was not started by this client",
                                       field="episode_id", received=episode_id) from None
