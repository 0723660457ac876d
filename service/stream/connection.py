"""One open stream: a session's steps taken as their messages come, answered in order.

    message ─► Dialect.decode ─► ActRequest of the session ─► ActService.accept (validate,
      bind) ─► submit_nowait (the shared batcher) ─► outbox (answers in the order of their
      messages) ─► Outlet.send

``StreamConnection`` knows no socket: a transport hands it each whole message (``take``)
and gets the frames back through its ``Outlet`` in message order, a step's answer after
those of the messages before it. The transport keeps the backpressure: it reads no more
while ``unanswered`` is at ``RLSERVE_STREAM_MAX_INFLIGHT`` (and, on a socket, while the
socket's write buffer is full), so TCP pushes back on the client and nothing queues without
bound. The transports: ``socket.py`` (the frames parsed and written inside the server's
HTTP protocol, ``rlserve serve``) and ``asgi.py`` (any ASGI server's WebSocket).

The seam of a message's handling: ``_take`` reads a message with the dialect, puts its
``Step`` in the ``outbox`` (one per message, in message order) and hands both to ``_step``,
the single-agent step; a policy set's stream (``agents.py``) overrides ``_step``,
``_taken`` and ``_finish``. A handler gets its step's answer to ``Step.reply`` (which sets the
``frame`` and flushes), or holds later messages behind a store read (``_hold``): the order,
the backpressure and the close codes stay here. Whatever a decoder or a handler raises, the
message is answered: a decoder's unexpected exception on the client's bytes is a 400
``unreadable`` (counted), a handler's is a logged bug and a 500 error frame.

The connection holds a session id, not a session: every step goes through the act use
case exactly as an HTTP step with ``session_id`` (the same resolution, binding, batches,
experience log, metrics). Closing the socket leaves the session to expire as sessions do;
``{"end": true}`` ends it once the steps before it are answered.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from rlserve.service.access_log import AccessLog, current_note
from rlserve.service.act.use_case import Accepted, ActService
from rlserve.service.act.wire import ActRequest, Seed
from rlserve.service.engine.batcher import BatchInfo
from rlserve.service.engine.metrics import Metrics
from rlserve.service.errors import BadRequest, ServiceError, as_service_error, body_too_large
from rlserve.service.sessions.base import SessionMiss, after_loading
from rlserve.service.stream import frames

log = logging.getLogger("rlserve.stream")

CLOSE_END = 1000  # the client's `end` was answered
CLOSE_UNREADABLE = 1008  # policy violation: too many messages that could not be read
CLOSE_TOO_BIG = 1009  # a message past RLSERVE_MAX_BODY_BYTES


@dataclass(frozen=True, slots=True)
class StreamOptions:
    """What a stream was opened with (its query parameters), for every step it takes."""

    session_id: str
    resume: bool  # the session exists: the first step continues its episode
    version: str | None = None
    seed: int | None = None
    explore: bool | None = None
    outputs: tuple[str, ...] = ()
    debug: bool = False
    observation_key: str = "observation"  # openpi's dict key of the observation
    clip_actions: bool | None = None  # a policy set's stream (``agents.py``): as its act request's
    unsquash_actions: bool | None = None


@dataclass(frozen=True, slots=True)
class StreamLimits:
    max_inflight: int
    max_unreadable: int
    max_message_bytes: int


class Dialect(Protocol):
    """How a route's frames read and write (``frames.STREAM``, ``openpi.OpenpiFrames``)."""

    route: str  # the access log's name of the route
    label: str  # the latency metric's route label

    def decode(self, kind: str, data: str | bytes) -> frames.StepMessage: ...
    def answer(self, kind: str, response: msgspec.Struct, tag: str | int | None, action_space: Any,
               started: float) -> dict[str, Any]: ...
    def error(self, kind: str, exc: ServiceError, tag: str | int | None) -> dict[str, Any]: ...
    def frame(self, kind: str, payload: dict[str, Any]) -> dict[str, Any]: ...


class Outlet(Protocol):
    """Where a connection's frames go, in order (the socket's writer, or an ASGI ``send``)."""

    def send(self, frame: dict[str, Any]) -> None: ...  # one answer or error frame
    def close(self, code: int) -> None: ...  # the last thing sent


class _Slot:
    """One place in the outbox: a frame (None until it is known), and the close code to
    send after it (0: the connection goes on)."""

    __slots__ = ("frame", "code")

    def __init__(self, frame: dict[str, Any] | None = None, code: int = 0):
        self.frame, self.code = frame, code


class Step(_Slot):
    """A message's place in the outbox: its batch's ``encode`` and ``reply`` (bound methods,
    no closures); the first reply is its frame."""

    __slots__ = ("connection", "kind", "tag", "note")

    def __init__(self, connection: StreamConnection, kind: str, tag: str | int | None, note: Any):
        super().__init__()
        self.connection, self.kind, self.tag, self.note = connection, kind, tag, note

    def encode(self, accepted: Accepted, output: Any, info: BatchInfo) -> dict[str, Any]:
        connection = self.connection
        connection.service.observe_latency(accepted, connection.dialect.label)
        return connection.dialect.answer(self.kind, connection.service.answer(accepted, output, info), self.tag,
                                         accepted.policy.pipeline.action_space, accepted.started)

    def reply(self, payload: Any, error: ServiceError | None) -> None:
        if self.frame is not None:  # answered already (a handler that raised after submitting)
            return
        connection = self.connection
        if error is not None:
            payload = connection._error(self.kind, error, self.tag)
        connection._log(200 if error is None else error.status, self.note)
        self.frame = payload
        connection._flush()


class _Ending(_Slot):
    """The outbox's mark of an ``end`` message: handled once the answers before it are sent."""

    __slots__ = ("kind", "tag", "task")

    def __init__(self, kind: str, tag: str | int | None):
        super().__init__(code=CLOSE_END)
        self.kind, self.tag = kind, tag
        self.task: asyncio.Task | None = None


class StreamConnection:
    """One session's steps, whatever carries the frames: ``take`` a message, and the answers
    go to the ``Outlet`` in message order. ``unanswered`` (the messages taken whose frames
    were not handed on yet) is what a transport holds to ``max_inflight`` by reading less."""

    def __init__(self, service: ActService, metrics: Metrics | None, access: AccessLog | None, name: str,
                 options: StreamOptions, limits: StreamLimits, outlet: Outlet, dialect: Dialect = frames.STREAM):
        self.service, self.metrics, self.access, self.dialect = service, metrics, access, dialect
        self.name, self.options, self.limits, self.outlet = name, options, limits, outlet
        self.starts = not options.resume  # the next step starts an episode
        self.seed = options.seed  # seeds the first episode only
        self.outputs: list[Any] = list(options.outputs)  # names route.py checked against Extra
        self.unreadable = 0
        self.outbox: deque[_Slot] = deque()
        self.held: deque[tuple[str, str | bytes, float]] | None = None  # behind a session being read
        self.closed = False  # a close is queued: no message more is taken
        self.gone = False  # the socket is gone: nothing more is sent

    @property
    def unanswered(self) -> int:
        return len(self.outbox) + (len(self.held) if self.held is not None else 0)

    def take(self, kind: str, data: str | bytes) -> None:
        """Handle one message; after a close is queued (``closed``), messages are ignored."""
        if self.closed:
            return
        if self.held is not None:  # a step waits for its session to be read: the later ones wait behind it
            self.held.append((kind, data, time.perf_counter()))
            return
        self._take(kind, data, time.perf_counter())

    def too_big(self, kind: str, size: int) -> None:
        """A message past ``RLSERVE_MAX_BODY_BYTES``: its error frame, then close 1009."""
        if not self.closed:
            self._refuse(kind, body_too_large(size, self.limits.max_message_bytes), None, time.perf_counter(),
                         CLOSE_TOO_BIG)

    def close(self, code: int) -> None:
        """Close after the answers already queued (a transport's shutdown)."""
        if not self.closed:
            self.closed = True
            self.outbox.append(_Slot(None, code))
            self._flush()

    def lost(self) -> None:
        """The socket is gone: answers still coming are dropped, an ``end`` not yet run is not."""
        self.gone = self.closed = True
        self.held = None
        for slot in self.outbox:
            if isinstance(slot, _Ending) and slot.task is not None:
                slot.task.cancel()
        self.outbox.clear()

    # ------------------------------------------------------------------ reading

    def _take(self, kind: str, data: str | bytes, started: float) -> None:
        if len(data) > self.limits.max_message_bytes:  # a transport without its own limit
            self._refuse(kind, body_too_large(len(data), self.limits.max_message_bytes), None, started, CLOSE_TOO_BIG)
            return
        try:
            message = self.dialect.decode(kind, data)
        except frames.Unreadable as exc:
            self._unreadable(kind, exc, started)
            return
        except ServiceError as exc:  # read, but not a step (a dialect's missing observation): not counted
            self._refuse(kind, exc, None, started)
            return
        except Exception as exc:  # a decoder's surprise on the client's bytes: still bytes it cannot read
            log.warning("a stream message's decoder raised %s", type(exc).__name__, exc_info=exc)
            self._unreadable(kind, frames.Unreadable(
                f"message could not be read ({type(exc).__name__})", field="message",
                expected="a step message (docs/api.md)", received=f"{len(data)} bytes"), started)
            return
        if message.end:
            self.closed = True
            self.outbox.append(_Ending(kind, message.tag))
            self._flush()
            return
        step = Step(self, kind, message.tag, None if self.access is None else self.access.note())
        self.outbox.append(step)
        try:
            self._step(step, message, started)
        except Exception as exc:  # a refusal (an error frame, the connection stays open), or a logged bug
            step.reply(None, as_service_error(exc, log, "stream step failed"))

    def _unreadable(self, kind: str, exc: frames.Unreadable, started: float) -> None:
        self.unreadable += 1
        limit = self.unreadable >= self.limits.max_unreadable
        self._refuse(kind, exc, None, started, CLOSE_UNREADABLE if limit else 0)

    def _step(self, step: Step, message: Any, started: float) -> None:
        """Take one step message: its answer goes to ``step.reply``; raises what refuses it."""
        request = self._request(message)
        try:
            accepted = self._accept(request, started, step.note)
        except SessionMiss as miss:  # rare: a resumed session another replica held; read in order
            self._hold(step, message, self._submit_loaded(miss, step, request, started))
            return
        self.service.submit_nowait(accepted, step.encode, step.reply)
        self._taken(message)

    def _taken(self, message: Any) -> None:
        """The step went to its batch: the next starts an episode after one that ended."""
        self.starts = message.terminated or message.truncated
        self.seed = None

    def _accept(self, request: ActRequest, started: float, note: Any) -> Accepted:
        return noted(note, self.service.accept, self.name, self.options.version, request, started)

    async def _submit_loaded(self, miss: SessionMiss, step: Step, request: ActRequest, started: float) -> None:
        accepted = await after_loading(miss, functools.partial(self._accept, request, started, step.note))
        self.service.submit_nowait(accepted, step.encode, step.reply)

    def _hold(self, step: Step, message: Any, loading: Coroutine[Any, Any, None]) -> None:
        """The messages after this one wait until ``loading`` (the store's read, then the
        step's submit) is done, so that they are taken in order."""
        self.held = deque()
        asyncio.get_running_loop().create_task(self._after_loading(step, message, loading))

    async def _after_loading(self, step: Step, message: Any, loading: Coroutine[Any, Any, None]) -> None:
        try:
            await loading
            self._taken(message)
        except Exception as exc:
            step.reply(None, as_service_error(exc, log, "stream step failed"))
        held, self.held = self.held, None
        while held and self.held is None and not self.closed:  # the messages that came meanwhile, in order
            kind, data, at = held.popleft()
            self._take(kind, data, at)
        if held and self.held is not None:
            self.held.extendleft(reversed(held))

    def _starts(self, episode_start: bool, seed: int | None) -> tuple[bool, int | None]:
        """Whether a message's step starts an episode, and the seed of that episode: the
        message's, else the stream's first episode's; a seed on a step that starts none is a 400."""
        starts = self.starts or episode_start
        if seed is not None and not starts:
            raise BadRequest("'seed' seeds the episode a step starts", field="seed",
                             expected="'seed' with 'episode_start' (or on a stream's first step)", received=int(seed))
        return starts, seed if seed is not None else self.seed if starts else None

    def _request(self, message: frames.StepMessage) -> ActRequest:
        options = self.options
        starts, seed = self._starts(message.episode_start, message.seed)
        return ActRequest(
            observation=message.observation, session_id=options.session_id, episode_start=starts,
            reward=message.reward, prev_action=message.prev_action, action_mask=message.action_mask,
            seed=None if seed is None else Seed(seed),
            step=message.step, explore=options.explore, outputs=self.outputs, debug=options.debug,
            terminated=message.terminated, truncated=message.truncated)

    def _refuse(self, kind: str, exc: ServiceError, tag: str | int | None, started: float, code: int = 0) -> None:
        if code:
            self.closed = True
        self.outbox.append(_Slot(self._error(kind, exc, tag), code))
        if self.access is not None:
            note = self.access.note()
            note.started = started
            self._log(exc.status, note)
        self._flush()

    def _error(self, kind: str, exc: ServiceError, tag: str | int | None) -> dict[str, Any]:
        if self.metrics is not None:
            self.metrics.error(exc.code, exc.status)
        return self.dialect.error(kind, exc, tag)

    def _log(self, status: int, note: Any) -> None:
        if note is not None and self.access is not None:
            self.access.record("WS", self.dialect.route, status, note, self.name)

    # ------------------------------------------------------------------ writing

    def _flush(self) -> None:
        """Hand the outbox's ready frames on, in order; an ``end`` runs once it is first."""
        outbox, outlet = self.outbox, self.outlet
        while outbox and not self.gone:
            slot = outbox[0]
            if slot.frame is None:
                if isinstance(slot, _Ending):
                    if slot.task is None:
                        slot.task = asyncio.get_running_loop().create_task(self._end(slot))
                elif slot.code:
                    outbox.popleft()
                    outlet.close(slot.code)
                return
            outbox.popleft()
            outlet.send(slot.frame)
            if slot.code:
                outbox.clear()
                outlet.close(slot.code)
                return

    async def _end(self, ending: _Ending) -> None:
        """End the session (every step before it was answered): the answer to ``end``."""
        try:
            await self._finish()
        except Exception as exc:  # gone already (expired, ended elsewhere): said, then closed
            ending.frame = self._error(ending.kind, as_service_error(exc, log, "stream end failed"), ending.tag)
        else:
            payload: dict[str, Any] = {"ended": self.options.session_id}
            if ending.tag is not None:
                payload["tag"] = ending.tag
            ending.frame = self.dialect.frame(ending.kind, payload)
        self._flush()

    async def _finish(self) -> None:
        """What ``end`` ends: the stream's session."""
        sessions = self.service.registry.entry(self.name).sessions
        await sessions.close(await sessions.lookup(self.options.session_id))


def noted(note: Any, accept: Callable[..., Any], *args: Any) -> Any:
    """``accept(*args)`` with the access log's ``note`` current (where the use case notes the
    request's rows), as the HTTP act protocol sets it around its requests."""
    token = None if note is None else current_note.set(note)
    try:
        return accept(*args)
    finally:
        if token is not None:
            current_note.reset(token)
