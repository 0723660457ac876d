"""A policy set's stream: one WebSocket per multi-agent episode (docs/api.md "A policy set's stream").

``AgentsStream`` (blocking) and ``AsyncAgentsStream`` open ``/v1/models/{set}/agents/stream``;
``step(agents)`` sends the agents that act now (agent id -> its step, as in
``AgentsClient.act``) and returns the ``AgentsResult``; ``send``/``receive`` pipeline several
steps (answers in order, with their tags). The episode API of ``AgentsClient``
(``get_actions``, ``log_returns``, ``agents_done``, ``end_episode``) is here too, without an
episode id: the stream is the episode. ``binary=True`` sends msgpack frames (numpy arrays as
``msgpack_numpy`` maps); an error frame raises its ``RLServeError`` and the stream goes on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlencode

from rlserve.client.agents_episode import AgentsEpisode
from rlserve.client.agents_result import AgentsResult
from rlserve.client.stream import _AsyncSocket, _BlockingSocket, _Frames

__all__ = ["AgentsStream", "AsyncAgentsStream", "agents_stream_url"]


def agents_stream_url(base_url: str, model: str, *, seed: int | None = None, explore: bool | None = None,
                      outputs: tuple[str, ...] | list[str] = (), episode_id: str | None = None,
                      clip_actions: bool | None = None, unsquash_actions: bool | None = None) -> str:
    """The ``ws://`` (or ``wss://``) address of a policy set's stream with these options."""
    query: dict[str, str] = {}
    for key, value in (("explore", explore), ("clip_actions", clip_actions), ("unsquash_actions", unsquash_actions)):
        if value is not None:
            query[key] = "true" if value else "false"
    if seed is not None:
        query["seed"] = str(seed)
    if outputs:
        query["outputs"] = ",".join(outputs)
    if episode_id is not None:
        query["episode_id"] = episode_id
    scheme, _, rest = base_url.rstrip("/").partition("://")
    ws = {"http": "ws", "https": "wss"}.get(scheme, scheme)
    return f"{ws}://{rest}/v1/models/{model}/agents/stream" + (f"?{urlencode(query)}" if query else "")


class _Episode:
    """Messages and answers of one stream, and its episode's bookkeeping (both streams')."""

    def __init__(self, binary: bool, options: dict[str, Any]):
        self.frames = _Frames(binary)
        self.frames.session_id = options.get("episode_id")
        self.episode = AgentsEpisode(self.frames.session_id or "", options.get("seed"),
                                     started=options.get("episode_id") is not None)

    def message(self, agents: Mapping[str, Mapping[str, Any]], episode_start: bool, episode_end: bool,
                seed: int | None, tag: str | int | None) -> str | bytes:
        body: dict[str, Any] = {"agents": {agent: dict(step) for agent, step in agents.items()}}
        for key, value in (("episode_start", episode_start), ("episode_end", episode_end)):
            if value:
                body[key] = True
        if seed is not None:
            body["seed"] = seed
        if tag is not None:
            body["tag"] = tag
        return self.frames.encode(body)

    def result(self, frame: str | bytes) -> AgentsResult:
        data = self.frames.read(frame)
        self.frames.session_id = data.get("episode_id", self.frames.session_id)
        return AgentsResult(data)

    def next_step(self, observations: Mapping[str, Any], action_masks: Mapping[str, Any] | None) -> str | bytes:
        self.episode.started = True
        return self.message(self.episode.step_agents(observations, action_masks), False, False, None, None)

    def last_step(self, observations: Mapping[str, Any] | None, truncated: bool) -> str | bytes | None:
        """The message that ends the episode: its last agents, or ``end`` (None: nothing to end)."""
        done = self.episode.last_agents(observations, truncated)
        if not self.episode.started:
            return None
        return self.message(done, False, True, None, None) if done else self.frames.encode({"end": True})


class AgentsStream(_BlockingSocket):
    """A blocking stream of one multi-agent episode; a context manager (leaving it closes the
    socket, not the episode)."""

    def __init__(self, base_url: str, model: str, *, binary: bool = False, timeout: float = 10.0,
                 headers: dict[str, str] | None = None, **options: Any):
        """Open a stream of the policy set ``model`` (options: ``seed``, ``explore``, ``outputs``,
        ``clip_actions``, ``unsquash_actions``, ``episode_id`` to resume an episode)."""
        self._episode = _Episode(binary, options)
        super().__init__(agents_stream_url(base_url, model, **options), self._episode.frames, timeout, headers)

    @property
    def episode_id(self) -> str | None:
        """The episode's id (known after the first answer, or given to resume it)."""
        return self._episode.frames.session_id

    def send(self, agents: Mapping[str, Mapping[str, Any]], *, episode_start: bool = False,
             episode_end: bool = False, seed: int | None = None, tag: str | int | None = None) -> None:
        """Send one step without waiting for its answer (``receive`` reads the answers in order)."""
        self._ws.send(self._episode.message(agents, episode_start, episode_end, seed, tag))

    def receive(self) -> AgentsResult:
        """The next answer; raises the ``RLServeError`` of an error frame."""
        return self._episode.result(self._ws.recv(timeout=self._timeout))

    def step(self, agents: Mapping[str, Mapping[str, Any]], **fields: Any) -> AgentsResult:
        """One step: ``send`` then ``receive``."""
        self.send(agents, **fields)
        return self.receive()

    def get_actions(self, observations: Mapping[str, Any], *,
                    action_masks: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``AgentsClient.get_actions`` of the stream's episode."""
        self._ws.send(self._episode.next_step(observations, action_masks))
        return self.receive().actions

    def log_returns(self, rewards: Mapping[str, float]) -> None:
        """Rewards received since the agents' last actions (sent with their next step)."""
        self._episode.episode.log_returns(rewards)

    def agents_done(self, agent_ids: Iterable[str], *, observations: Mapping[str, Any] | None = None,
                    truncated: bool = False) -> None:
        """These agents finished (``AgentsClient.agents_done``)."""
        self._episode.episode.finish(agent_ids, observations, truncated)

    def end_episode(self, observations: Mapping[str, Any] | None = None, *,
                    truncated: bool = False) -> dict[str, float]:
        """End the episode (``AgentsClient.end_episode``) and close the stream; returns each
        agent's summed reward."""
        last = self._episode.last_step(observations, truncated)
        if last is not None:
            self._ws.send(last)
            self._episode.frames.read(self._ws.recv(timeout=self._timeout))
        self.close()
        return dict(self._episode.episode.returns)



class AsyncAgentsStream(_AsyncSocket):
    """An asyncio policy set stream: ``async with AsyncAgentsStream(...) as stream``."""

    def __init__(self, base_url: str, model: str, *, binary: bool = False, timeout: float = 10.0,
                 headers: dict[str, str] | None = None, **options: Any):
        """A stream of the policy set ``model``, opened by ``open()`` or ``async with``;
        options as ``AgentsStream``'s."""
        self._episode = _Episode(binary, options)
        super().__init__(agents_stream_url(base_url, model, **options), self._episode.frames, timeout, headers)

    @property
    def episode_id(self) -> str | None:
        """The episode's id (known after the first answer, or given to resume it)."""
        return self._episode.frames.session_id

    async def send(self, agents: Mapping[str, Mapping[str, Any]], *, episode_start: bool = False,
                   episode_end: bool = False, seed: int | None = None, tag: str | int | None = None) -> None:
        """Send one step without waiting for its answer (``receive`` reads the answers in order)."""
        await self._socket().send(self._episode.message(agents, episode_start, episode_end, seed, tag))

    async def receive(self) -> AgentsResult:
        """The next answer; raises the ``RLServeError`` of an error frame."""
        return self._episode.result(await self._socket().recv())

    async def step(self, agents: Mapping[str, Mapping[str, Any]], **fields: Any) -> AgentsResult:
        """One step: ``send`` then ``receive``."""
        await self.send(agents, **fields)
        return await self.receive()

    async def get_actions(self, observations: Mapping[str, Any], *,
                          action_masks: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``AgentsStream.get_actions``, awaitable."""
        await self._socket().send(self._episode.next_step(observations, action_masks))
        return (await self.receive()).actions

    def log_returns(self, rewards: Mapping[str, float]) -> None:
        """Rewards received since the agents' last actions (sent with their next step)."""
        self._episode.episode.log_returns(rewards)

    def agents_done(self, agent_ids: Iterable[str], *, observations: Mapping[str, Any] | None = None,
                    truncated: bool = False) -> None:
        """These agents finished (``AgentsClient.agents_done``)."""
        self._episode.episode.finish(agent_ids, observations, truncated)

    async def end_episode(self, observations: Mapping[str, Any] | None = None, *,
                          truncated: bool = False) -> dict[str, float]:
        """``AgentsStream.end_episode``, awaitable."""
        last = self._episode.last_step(observations, truncated)
        if last is not None:
            await self._socket().send(last)
            self._episode.frames.read(await self._socket().recv())
        await self.close()
        return dict(self._episode.episode.returns)
