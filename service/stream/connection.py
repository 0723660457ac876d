"""One open stream: a session's steps read from the socket, answered in order.

    receive (at most ``max_inflight`` unanswered) ─► frames.decode ─► ActRequest of the
      session ─► ActService.accept (validate, bind) ─► submit_nowait (the shared batcher)
      ─► outbox (answers in the order of their messages) ─► send

The reader takes a message only while fewer than ``max_inflight`` steps are unanswered:
past that it stops receiving, uvicorn stops reading the socket, and TCP pushes back on
the client; nothing queues without bound. The writer sends the outbox in order: a step's
answer waits for those of the messages before it.

The connection holds a session id, not a session: every step goes through the act use
case exactly as an HTTP step with ``session_id`` (the same resolution, binding, batches,
experience log, metrics). Closing the socket leaves the session to expire as sessions do;
``{"end": true}`` ends it once the steps before it are answered.
"""

from __future__ import annotations

import asyncio
import logging
import time
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


class _Ending:
    """The outbox's mark of an ``end`` message: handled once the answers before it are sent."""

    __slots__ = ("kind", "tag")

    def __init__(self, kind: str, tag: str | int | None):
        self.kind, self.tag = kind, tag


class StreamConnection:
    def __init__(self, service: ActService, metrics: Metrics | None, access: AccessLog | None, name: str,
                 options: StreamOptions, limits: StreamLimits, send: Any, dialect: Dialect = frames.STREAM):
        self.service, self.metrics, self.access, self.dialect = service, metrics, access, dialect
        self.name, self.options, self.limits, self.send = name, options, limits, send
        self.starts = not options.resume  # the next step starts an episode
        self.seed = options.seed  # seeds the first episode only
        self.outputs: list[Any] = list(options.outputs)  # names route.py checked against Extra
        self.unreadable = 0
        self.room = asyncio.Semaphore(limits.max_inflight)
        self.outbox: asyncio.Queue[asyncio.Future | _Ending | int] = asyncio.Queue()

    async def run(self, receive: Any) -> None:
        writer = asyncio.get_running_loop().create_task(self._write())
        try:
            while True:
                await self.room.acquire()
                if writer.done():  # the socket failed or closed: nothing more is sent
                    break
                message = await receive()
                if message["type"] != "websocket.receive":  # websocket.disconnect: the client left
                    writer.cancel()
                    break
                text = message.get("text")
                if text is not None:
                    closing = await self._take(frames.TEXT, text)
                else:
                    closing = await self._take(frames.BINARY, message.get("bytes") or b"")
                if closing:
                    break
            await asyncio.wait([writer])  # what is queued is sent (or the client is gone)
        except asyncio.CancelledError:
            writer.cancel()
            raise

    # ------------------------------------------------------------------ reading

    async def _take(self, kind: str, data: str | bytes) -> bool:
        """Handle one message; True when the connection closes after what is queued."""
        started = time.perf_counter()
        if len(data) > self.limits.max_message_bytes:  # uvicorn's ws_max_size closes first under `rlserve serve`
            self._refuse(kind, body_too_large(len(data), self.limits.max_message_bytes), None, started)
            self.outbox.put_nowait(CLOSE_TOO_BIG)
            return True
        try:
            message = self.dialect.decode(kind, data)
        except frames.Unreadable as exc:
            self._refuse(kind, exc, None, started)
            self.unreadable += 1
            if self.unreadable >= self.limits.max_unreadable:
                self.outbox.put_nowait(CLOSE_UNREADABLE)
                return True
            return False
        except ServiceError as exc:  # read, but not a step (a dialect's missing observation): not counted
            self._refuse(kind, exc, None, started)
            return False
        if message.end:
            self.outbox.put_nowait(_Ending(kind, message.tag))
            return True
        await self._step(kind, message, started)
        return False

    async def _step(self, kind: str, message: frames.StepMessage, started: float) -> None:
        done = asyncio.get_running_loop().create_future()
        self.outbox.put_nowait(done)
        note = None if self.access is None else self.access.note()
        tag = message.tag

        def accept() -> tuple[Accepted, Any]:
            token = None if note is None else current_note.set(note)
            try:
                return self.service.accept(self.name, self.options.version, request, started), encode
            finally:
                if token is not None:
                    current_note.reset(token)

        def encode(accepted: Accepted, output: Any, info: BatchInfo) -> dict[str, Any]:
            self.service.observe_latency(accepted, self.dialect.label)
            return self.dialect.answer(kind, self.service.answer(accepted, output, info), tag,
                                       accepted.policy.pipeline.action_space, accepted.started)

        def reply(payload: Any, error: ServiceError | None) -> None:
            if error is not None:
                payload = self._error(kind, error, tag)
            self._log(200 if error is None else error.status, note)
            done.set_result(payload)

        try:
            request = self._request(message)
            try:
                accepted, _ = accept()
            except SessionMiss as miss:  # rare: a resumed session another replica held; read in order
                accepted, _ = await after_loading(miss, accept)
            self.service.submit_nowait(accepted, encode, reply)
        except Exception as exc:  # a refusal: an error frame, the connection stays open
            reply(None, as_service_error(exc, log, "stream step failed"))
            return
        # Taken: the stream's next step starts an episode after one that ended.
        self.starts = message.terminated or message.truncated
        self.seed = None

    def _request(self, message: frames.StepMessage) -> ActRequest:
        options = self.options
        starts = self.starts or message.episode_start
        if message.seed is not None and not starts:
            raise BadRequest("'seed' seeds the episode a step starts", field="seed",
                             expected="'seed' with 'episode_start' (or on a stream's first step)",
                             received=int(message.seed))
        seed = message.seed if message.seed is not None else self.seed if starts else None
        return ActRequest(
            observation=message.observation, session_id=options.session_id, episode_start=starts,
            reward=message.reward, prev_action=message.prev_action, action_mask=message.action_mask,
            seed=None if seed is None else Seed(seed),
            step=message.step, explore=options.explore, outputs=self.outputs, debug=options.debug,
            terminated=message.terminated, truncated=message.truncated)

    def _refuse(self, kind: str, exc: ServiceError, tag: str | int | None, started: float) -> None:
        done = asyncio.get_running_loop().create_future()
        done.set_result(self._error(kind, exc, tag))
        self.outbox.put_nowait(done)
        if self.access is not None:
            note = self.access.note()
            note.started = started
            self._log(exc.status, note)

    def _error(self, kind: str, exc: ServiceError, tag: str | int | None) -> dict[str, Any]:
        if self.metrics is not None:
            self.metrics.error(exc.code, exc.status)
        return self.dialect.error(kind, exc, tag)

    def _log(self, status: int, note: Any) -> None:
        if note is not None and self.access is not None:
            self.access.record("WS", self.dialect.route, status, note, self.name)

    # ------------------------------------------------------------------ writing

    async def _write(self) -> None:
        """Send the outbox in order; a close code or an ``end`` is the last thing sent."""
        send, outbox, room = self.send, self.outbox, self.room
        try:
            while True:
                item = await outbox.get()
                if isinstance(item, int):
                    await send({"type": "websocket.close", "code": item})
                    return
                if isinstance(item, _Ending):
                    await send(await self._end(item))
                    await send({"type": "websocket.close", "code": CLOSE_END})
                    return
                await send(await item)
                room.release()
        except OSError:  # the client is gone (uvicorn's ClientDisconnected): the reader sees it too
            return
        finally:
            room.release()  # a reader waiting for room wakes, sees the writer done, and stops

    async def _end(self, ending: _Ending) -> dict[str, Any]:
        """End the session (every step before it was answered): the answer to ``end``."""
        entry_id = self.options.session_id
        try:
            sessions = self.service.registry.entry(self.name).sessions
            session = await sessions.lookup(entry_id)
            await sessions.close(session)
        except Exception as exc:  # gone already (expired, ended elsewhere): said, then closed
            return self._error(ending.kind, as_service_error(exc, log, "stream end failed"), ending.tag)
        payload: dict[str, Any] = {"ended": entry_id}
        if ending.tag is not None:
            payload["tag"] = ending.tag
        return self.dialect.frame(ending.kind, payload)

