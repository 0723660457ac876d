"""The in-process session store: sessions of one model version in this process's memory.

A ``SessionStore`` (the default implementation of ``rlserve.service.sessions.base.SessionStore``)
belongs to one loaded model version. It maps session ids to
``Session`` records (slot index, seeded rng, bookkeeping) in least-recently-used order
and owns the ``SessionSlabs`` that hold the tensors. Sessions idle longer than the TTL
expire; at the cap the least recently used idle session is evicted. Expired, evicted and
ended ids are remembered (bounded) so a client hears 410 "expired" rather than 404
"unknown". All bookkeeping runs on the event loop thread.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import SupportsBytes

import numpy as np

from rlserve.models.interface import ModelSignature
from rlserve.service.errors import (
    BadRequest,
    QueueFull,
    ServiceError,
    SessionBusy,
    SessionConflict,
    SessionExpired,
    SessionNotFound,
    SessionsUnavailable,
    quoted,
)
from rlserve.service.sessions.record import (
    RecordError,
    SessionLayout,
    SessionRecord,
    encode_sessions,
)
from rlserve.service.sessions.slabs import STATELESS_SLOT, SessionSlabs

MAX_SESSION_ID_LENGTH = 128


@dataclass(eq=False)
class Session:
    id: str
    slot: int
    seed: int | None
    rng: np.random.Generator | None  # None: draws from the model's shared generator
    created: float
    last_used: float
    steps: int = 0
    inflight: int = 0  # requests accepted but not answered; such a session is never evicted
    ended: bool = False
    version: str = field(default="")
    # The last answer, kept when its request carried a step index so that a retry of that
    # step is answered again instead of applied twice (msgpack; see ``step.batch``).
    answer: bytes | None = None
    # The external store's bookkeeping (``rlserve.service.sessions.redis_store``): the
    # compare-and-set word of the copy held here, whether the store has a record at all,
    # and whether the copy was read from the store for the request now queued.
    revision: int = 0
    persisted: bool = False
    fresh: bool = False
    # The experience log's open step of this episode (``rlserve.service.experience.trail``):
    # bytes, or an object that is its bytes (``bytes(trail)``), written in the session's
    # record so that it travels to whichever replica serves the next step.
    trail: SupportsBytes | None = None
    # The live results' running episode (``rlserve.service.sessions.scoring``): its return
    # and length so far, whether this process saw it from its start (only such an episode
    # is scored), and the step count it last saw (a step served elsewhere breaks the run).
    episode_return: float = 0.0
    episode_length: int = 0
    scored: bool = False
    seen_steps: int = 0


class SessionStore:
    """Sessions of one model version, with LRU eviction and idle expiry."""

    # Whether every step must be validated and committed around its batch (``validate``,
    # ``commit``); this store keeps everything in memory, so nothing is.
    durable = False
    # An idle session that expires or is evicted is gone for good here, so its id is
    # remembered (410); a cache over an external store only forgets its copy.
    remembers_idle = True

    def __init__(
        self,
        signature: ModelSignature,
        *,
        version: str,
        max_sessions: int,
        idle_ttl_s: float,
        initial_slots: int = 64,
        tombstones: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
        refusal: str | None = None,
    ):
        self.signature = signature
        self.version = version
        # Why sessions cannot be created here (e.g. several workers without a shared store).
        self.refusal = refusal
        self.max_sessions = int(max_sessions)
        self.idle_ttl_s = float(idle_ttl_s)
        self.clock = clock
        # +1: slot 0 is the read-only initial row for stateless requests.
        self.slabs = SessionSlabs(signature, initial_slots + 1, self.max_sessions + 1)
        self.layout = SessionLayout(signature)  # a session as bytes (export, import, external stores)
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._free: list[int] = []
        self._next_slot = STATELESS_SLOT + 1
        self._tombstones: OrderedDict[str, str] = OrderedDict()
        self._tombstone_cap = int(tombstones)
        self.evicted_total = 0
        self.expired_total = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    def ids(self) -> list[str]:
        return list(self._sessions)

    # ------------------------------------------------------------------ lookup

    def get(self, session_id: str) -> Session:
        """The live session ``session_id``; 410 if it expired or ended, 404 if unknown."""
        session = self._sessions.get(session_id)
        if session is not None:
            if self.clock() - session.last_used > self.idle_ttl_s and not session.inflight:
                self._drop(session, "expired after being idle")
            else:
                return session
        reason = self._tombstones.get(session_id)
        if reason is not None:
            raise SessionExpired(
                f"session {quoted(session_id)} is gone ({reason}); start a new episode",
                field="session_id",
                received=session_id,
            )
        raise SessionNotFound(
            f"unknown session {quoted(session_id)}: create it (POST .../sessions) or send episode_start=true",
            field="session_id",
            received=session_id,
        )

    def live(self, session_id: str) -> Session | None:
        """The live session or None (the hot-path lookup: no exceptions, no messages).

        A session idle past its TTL counts as not live; ``get`` then reports why.
        """
        session = self._sessions.get(session_id)
        if session is not None and (session.inflight or self.clock() - session.last_used <= self.idle_ttl_s):
            return session
        return None

    def knows(self, session_id: str) -> bool:
        """True if the id is live or remembered as gone."""
        return session_id in self._sessions or session_id in self._tombstones

    def touch(self, session: Session) -> None:
        session.last_used = self.clock()
        if not session.ended:
            self._sessions.move_to_end(session.id)

    # ------------------------------------------------------------------ lifecycle

    def create(self, session_id: str | None = None, seed: int | None = None) -> Session:
        """A new session; 409 if ``session_id`` is live. Evicts the LRU idle one at the cap."""
        if self.refusal is not None:
            raise SessionsUnavailable(self.refusal, field="session_id", received=session_id)
        session_id = validate_session_id(session_id) if session_id is not None else uuid.uuid4().hex
        if session_id in self._sessions:
            raise SessionConflict(
                f"session {quoted(session_id)} already exists; end it first or send episode_start=true",
                field="session_id",
                received=session_id,
            )
        rng = _rng(seed)  # before anything changes: a bad seed must not leak a slot
        self.expire_idle()
        if len(self._sessions) >= self.max_sessions:
            self._evict_one()
        slot = self._take_slot()
        # A recycled slot still holds its previous owner's state; a new session starts
        # from the initial values whichever way it was created.
        with self.slabs.lock:
            self.slabs.reset(np.array([slot]))
        now = self.clock()
        session = Session(session_id, slot, seed, rng, now, now, version=self.version)
        self._sessions[session_id] = session
        self._tombstones.pop(session_id, None)
        return session

    def restart(self, session: Session, seed: int | None) -> None:
        """A new episode in an existing session, when its batch runs: count from 0 and
        reseed (None: keep drawing from the session's generator); the batch resets the slot."""
        session.steps = 0
        session.answer = None
        if seed is not None:
            session.seed, session.rng = seed, _rng(seed)

    def end(self, session_id: str) -> Session:
        session = self.get(session_id)
        self._drop(session, "ended by the client")
        return session

    def release(self, session: Session) -> None:
        """A request of ``session`` finished; free the slot if the session is gone."""
        session.inflight -= 1
        if session.ended and session.inflight == 0:
            self._free.append(session.slot)

    def expire_idle(self) -> int:
        """Drop every session idle longer than the TTL; returns how many.

        Sessions sit in least-recently-used order, so the scan stops at the first fresh
        one: the cost is proportional to what expires, not to the number of sessions.
        """
        deadline = self.clock() - self.idle_ttl_s
        stale = []
        for session in self._sessions.values():
            if session.last_used >= deadline:
                break
            if not session.inflight:
                stale.append(session)
        for session in stale:
            self._drop(session, "expired after being idle", tombstone=self.remembers_idle)
        self.expired_total += len(stale)
        return len(stale)

    # ------------------------------------------------------------------ the batch's rows

    def gather_rows(self, slots: np.ndarray, reset: np.ndarray, rewards: np.ndarray | None,
                    reported: np.ndarray | None) -> dict[str, np.ndarray]:
        """Apply a batch's session inputs and return its model inputs (state, prev actions
        and rewards), one row per entry of ``slots`` (B,).

        ``reset`` (B,) marks episode starts; ``rewards`` (B,) holds the previous step's
        reward (NaN where none was reported); ``reported`` (B, A) the actions the
        environment took instead of the served ones (NaN rows where none). Stateless rows
        (``STATELESS_SLOT``) read the initial values and are never written."""
        live = slots != STATELESS_SLOT
        every = live.all()  # the usual batch: every row a session's
        if not every:
            reset = reset & live
        slabs = self.slabs
        with slabs.lock:
            if rewards is not None and slabs.prev_rewards is not None:  # a model that reads them
                rows = ~np.isnan(rewards) & ~reset
                if not every:
                    rows &= live
                if rows.all():
                    slabs.report(slots, rewards, None)
                elif rows.any():
                    slabs.report(slots[rows], rewards[rows], None)
            if reported is not None and slabs.prev_actions is not None:
                rows = ~np.isnan(reported[:, 0]) & live & ~reset
                slabs.report(slots[rows], None, reported[rows])
            if reset.any():
                slabs.reset(slots[reset])
            return slabs.gather(slots)

    def scatter_rows(self, slots: np.ndarray, state_out: list[np.ndarray], actions: np.ndarray | None) -> None:
        """Store a batch's new state (and served flat actions) for its live session rows."""
        live = slots != STATELESS_SLOT
        if live.all():  # the usual batch: every row a session's, nothing to pick
            with self.slabs.lock:
                self.slabs.scatter(slots, state_out, actions)
            return
        if not live.any():
            return
        with self.slabs.lock:
            self.slabs.scatter(slots[live], [s[live] for s in state_out], None if actions is None else actions[live])

    # ------------------------------------------------------------------ lifecycle (the API)
    # Async because an external store answers them over the network; here nothing waits.

    async def open_session(self, session_id: str | None, seed: int | None) -> Session:
        return self.create(session_id, seed)

    async def end_session(self, session: Session) -> None:
        self._drop(session, "ended by the client")

    async def export_session(self, session: Session) -> bytes:
        """``session`` as a record (``rlserve.service.sessions.record``)."""
        with self.slabs.lock:
            rows = self.slabs.rows(np.array([session.slot]))
        return encode_sessions(self.layout, self.version, [session], [session.revision], rows, self.clock())[0]

    async def import_session(self, session_id: str, record: SessionRecord) -> Session:
        """Hold ``record`` as session ``session_id`` (replacing an idle one of that id)."""
        return self._replace(session_id, record)

    def adopt(self, session_id: str, data: bytes) -> Session:
        """Hold the record ``data`` of this version as ``session_id`` (``RecordError`` if it does not fit)."""
        record = self.layout.decode(data)
        if record.version != self.version:
            raise RecordError(f"the record is bound to version {record.version!r}, not {self.version!r}")
        return self._replace(session_id, record)

    def _replace(self, session_id: str, record: SessionRecord) -> Session:
        if self.refusal is not None:
            raise SessionsUnavailable(self.refusal, field="session_id", received=session_id)
        session_id = validate_session_id(session_id)
        old = self._sessions.get(session_id)
        if old is not None:
            if old.inflight:
                raise SessionBusy(f"session {quoted(session_id)} has a request in flight; retry when it is "
                                  "answered", field="session_id", received=session_id)
            self._drop(old, "", tombstone=False)
        self.expire_idle()
        if len(self._sessions) >= self.max_sessions:
            self._evict_one()
        slot = self._take_slot()
        with self.slabs.lock:
            self.slabs.put_rows(np.array([slot]), [row[None] for row in record.rows])
        now = self.clock()
        session = Session(session_id, slot, record.seed, record.rng,
                          created=now - max(0.0, time.time() - record.created),
                          last_used=now, steps=record.steps, version=self.version, answer=record.answer,
                          trail=record.trail)
        self._sessions[session_id] = session
        self._tombstones.pop(session_id, None)
        return session

    # ------------------------------------------------------------------ around a batch

    async def validate(self, groups: list[list[Session]]) -> list[ServiceError | None]:
        """Nothing to check: this process holds the only copy (see ``durable``)."""
        return [None] * len(groups)

    async def send_validate(self, groups: list[list[Session]]) -> bool:
        """Nothing to check (see ``validate``), so nothing is sent."""
        return False

    async def confirm(self, groups: list[list[Session]]) -> list[ServiceError | bool]:
        """Never called: ``send_validate`` sends nothing."""
        return [False] * len(groups)

    async def commit(self, groups: list[list[Session]]) -> list[ServiceError | None]:
        """Nothing to write: the batch already updated the slabs (see ``durable``)."""
        return [None] * len(groups)

    def discard(self, sessions: list[Session]) -> None:
        """A batch failed: the in-process copy is the only one and stays as the batch left it."""

    def forget(self, session: Session) -> None:
        """Let go of ``session`` without a tombstone (it lives on elsewhere: another version
        took its id, or the external store holds it)."""
        if self._sessions.get(session.id) is session:
            self._drop(session, "", tombstone=False)

    def clear(self) -> None:
        for session in list(self._sessions.values()):
            self._drop(session, "its model version was unloaded")

    async def close(self) -> None:
        """The model version is unloaded and its batcher stopped; nothing is held open here."""

    # ------------------------------------------------------------------ internals

    def _take_slot(self) -> int:
        if self._free:
            return self._free.pop()
        slot = self._next_slot
        self.slabs.ensure_capacity(slot + 1)
        self._next_slot += 1
        return slot

    def _evict_one(self) -> None:
        for session in self._sessions.values():
            if not session.inflight:
                self._drop(session, "evicted: the server's session limit was reached", tombstone=self.remembers_idle)
                self.evicted_total += 1
                return
        raise QueueFull(
            f"all {self.max_sessions} sessions have requests in flight; retry later",
            headers={"Retry-After": "1"},
        )

    def _drop(self, session: Session, reason: str, tombstone: bool = True) -> None:
        self._sessions.pop(session.id, None)
        session.ended = True
        if session.inflight == 0:
            self._free.append(session.slot)
        if tombstone and self._tombstone_cap:
            self._tombstones[session.id] = reason
            self._tombstones.move_to_end(session.id)
            while len(self._tombstones) > self._tombstone_cap:
                self._tombstones.popitem(last=False)


def _rng(seed: int | None) -> np.random.Generator | None:
    return np.random.default_rng(seed) if seed is not None else None


def validate_session_id(session_id: object) -> str:
    if not isinstance(session_id, str) or not 0 < len(session_id) <= MAX_SESSION_ID_LENGTH:
        raise BadRequest(
            f"session_id must be a non-empty string of at most {MAX_SESSION_ID_LENGTH} characters",
            field="session_id",
            expected=f"string of 1..{MAX_SESSION_ID_LENGTH} characters",
            received=session_id,
        )
    return session_id
