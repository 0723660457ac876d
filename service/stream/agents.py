"""A policy set's stream: ``/v1/models/{set}/agents/stream``, one multi-agent episode per connection.

    receive ─► AgentsStepMessage (the ``agents/act`` body without its envelope) ─► the
      AgentsActRequest of the connection's episode ─► AgentsActService.accept (the episode
      plan, every part checked and bound) ─► submit (the members' batchers) ─► outbox (in
      message order, tagged) ─► send

The connection holds an episode id, not an episode: every message is one request of the
multi-agent act use case, exactly as ``POST /v1/models/{set}/agents/act`` with
``episode_id`` (the same episode plan, canary draw per member, experience log, metrics),
and the reading, backpressure, order and close codes are ``StreamConnection``'s. The first
message starts the episode (seeded by the upgrade's ``seed``) unless the upgrade resumed one
(``episode_id``); a message with ``episode_end`` ends it once answered, and the next message
starts it again. ``{"end": true}`` ends the episode now and closes the stream (docs/api.md
"A policy set's stream").
"""

from __future__ import annotations

import functools
import logging
from typing import Annotated, Any

import msgspec

from rlserve.service.access_log import AccessLog, current_note
from rlserve.service.act.msgspec_errors import explain, unknown_field
from rlserve.service.act.wire import Seed, dec_hook
from rlserve.service.engine.metrics import Metrics
from rlserve.service.errors import BadRequest
from rlserve.service.multiagent.episode_service import EpisodeService
from rlserve.service.multiagent.use_case import AgentsActService
from rlserve.service.multiagent.wire import AgentsActRequest, AgentStep
from rlserve.service.sessions.base import SessionMiss
from rlserve.service.sessions.episode_store import validate_episode_id
from rlserve.service.stream import frames
from rlserve.service.stream.connection import Outlet, Step, StreamConnection, StreamLimits, StreamOptions, noted

log = logging.getLogger("rlserve.stream")

AGENTS_ROUTE = "/v1/models/{name}/agents/stream"


def check_upgrade(agents: AgentsActService, name: str, options: StreamOptions) -> None:
    """Before the accept: the policy set exists (404) and the episode id is one (400)."""
    agents.registry.policy_set(name)
    validate_episode_id(options.session_id)


class AgentsStepMessage(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One step of the stream's episode (the agents that act now), or ``end``."""

    agents: dict[str, AgentStep] = {}  # required unless `end`
    episode_start: bool = False  # restart the episode with this step
    episode_end: bool = False  # every agent's state ends once this step is answered
    seed: Seed | None = None  # seeds the episode this step starts
    tag: Annotated[str, msgspec.Meta(max_length=frames.MAX_TAG)] | int | None = None
    end: bool = False  # end the episode now (no agents) and close the stream


_FIELDS = list(AgentsStepMessage.__struct_fields__)
_JSON = msgspec.json.Decoder(AgentsStepMessage, dec_hook=dec_hook)
_EXPECTED = f"a JSON object (text frame) or msgpack map (binary frame) with the keys {_FIELDS}"


def decode(kind: str, data: str | bytes) -> Any:
    """A frame as an ``AgentsStepMessage``; ``frames.Unreadable`` if it is none."""
    try:
        if kind == frames.TEXT:
            return _JSON.decode(data)
        return msgspec.convert(frames.unpack(data), AgentsStepMessage, dec_hook=dec_hook)
    except msgspec.ValidationError as exc:
        message = str(exc)
        name = unknown_field(message)
        if name is not None:
            nested = "- at `$.agents" in message
            name = name.split("`", 1)[0]  # msgspec's "`colour` - at `$.agents[...]`" of an agent's step
            where = "an agent's step" if nested else "the message"
            known = list(AgentStep.__struct_fields__) if nested else _FIELDS
            raise frames.Unreadable(f"invalid message: unknown field {name!r} in {where}", field=name,
                                    expected=f"one of {known}", received=name) from None
        raw = (data.encode() if isinstance(data, str) else data) if kind == frames.TEXT else b""
        plain = explain(message, raw, schema="the policy set's stream message")
        raise frames.Unreadable(plain.message, field=plain.field, expected=plain.expected,
                                received=plain.received) from None
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise frames.Unreadable(f"message is not valid JSON: {exc}", expected=_EXPECTED,
                                received=f"{len(data)} bytes that do not parse") from None


class AgentsFrames:
    """The dialect of a policy set's stream: JSON text or msgpack frames as ``frames.STREAM``'s."""

    route = AGENTS_ROUTE  # the access log's name of the route
    label = "agents_stream"
    decode = staticmethod(decode)
    error = staticmethod(frames.error)
    frame = staticmethod(frames.frame)

    @staticmethod
    def answer(kind: str, response: Any, tag: str | int | None, action_space: Any = None,
               started: float = 0.0) -> dict[str, Any]:
        """The set's answer (plain data, per agent its action, logp, extras) with the tag."""
        if tag is not None:
            response["tag"] = tag
        return frames.frame(kind, response)


AGENTS = AgentsFrames()


def _answer(step: Step, response: dict[str, Any]) -> dict[str, Any]:
    """The encode of a step's plan: the set's answer as its frame."""
    return AGENTS.answer(step.kind, response, step.tag)


class AgentsStreamConnection(StreamConnection):
    """``StreamConnection`` whose steps are a policy set's (``_step``, ``_taken``, ``_finish``)."""

    def __init__(self, agents: AgentsActService, metrics: Metrics | None, access: AccessLog | None, name: str,
                 options: StreamOptions, limits: StreamLimits, outlet: Outlet):
        super().__init__(agents.act, metrics, access, name, options, limits, outlet, AGENTS)
        self.agents = agents
        self.episodes = EpisodeService(agents.registry)

    def _step(self, step: Step, message: Any, started: float) -> None:
        request = self._agents_request(message)
        encode = functools.partial(_answer, step)
        try:
            plan = noted(step.note, self.agents.accept_nowait, self.name, request, started, encode, AGENTS.label)
        except SessionMiss as miss:  # the episode or a member's session is in the store: read in order
            self._hold(step, message, self._submit_loaded_plan(miss, step, request, started))
            return
        self.agents.submit(plan, step.reply)
        self._taken(message)

    def _taken(self, message: Any) -> None:
        """Taken: the next message starts the episode again after one that ended."""
        self.starts = message.episode_end
        self.seed = None

    async def _submit_loaded_plan(self, miss: SessionMiss, step: Step, request: AgentsActRequest,
                                  started: float) -> None:
        if step.note is not None:
            current_note.set(step.note)  # this task's own context
        plan = await self.agents.accept_after(miss, self.name, request, started, functools.partial(_answer, step),
                                              AGENTS.label)
        self.agents.submit(plan, step.reply)

    def _agents_request(self, message: AgentsStepMessage) -> AgentsActRequest:
        options = self.options
        if not message.agents:
            raise BadRequest("a step message carries the agents that act now", field="agents",
                             expected="a map of agent id -> its step (at least one agent), or 'end'",
                             received="no agents")
        starts, seed = self._starts(message.episode_start, message.seed)
        return AgentsActRequest(
            agents=message.agents, episode_id=options.session_id, episode_start=starts,
            episode_end=message.episode_end, seed=None if seed is None else Seed(seed), explore=options.explore,
            clip_actions=options.clip_actions, unsquash_actions=options.unsquash_actions, outputs=self.outputs)

    async def _finish(self) -> None:
        """What ``end`` ends: the episode, when one is open (this stream's, or the one it resumed)."""
        if not self.starts:
            await self.episodes.end(self.name, self.options.session_id)
