"""What a session store is: the interface the act use case, the batch step and the routes rely on.

A store holds the sessions of one model version: their ids, seeded generators and
bookkeeping (``Session``), and the tensors each step reads and writes (recurrent or
attention state, previous actions and rewards), addressed by integer slots so that a
batch touches all its rows with one call each way. Two implementations:

- ``rlserve.service.sessions.store.SessionStore``: this process's memory (numpy slabs),
  the default. ``durable`` is False: ``validate``/``commit`` are never awaited.
- ``rlserve.service.sessions.redis_store.CachedSessionStore``: Redis or Valkey, with the
  slabs above as its cache. ``durable`` is True: the batcher awaits ``validate`` before
  each batch (the copies held here are the store's latest) and ``commit`` after it (a
  compare-and-set write of every session the batch stepped, before any answer is sent).

A lookup of a session this process does not hold, under an external store, raises
``SessionMiss``; the caller awaits ``SessionMiss.load()`` (one round trip for all the ids
of the request) and looks up again (``after_loading`` does both).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import numpy as np

from rlserve.service.errors import ServiceError, StoreUnavailable, quoted
from rlserve.service.sessions.record import SessionLayout, SessionRecord
from rlserve.service.sessions.store import Session


class SessionMiss(Exception):
    """Sessions may live in the external store but are not held here: ``await load()``
    (reads them into this process's cache, and remembers the ids the store does not
    have), look them up again, then ``settle()`` (forget what the read said: it answered
    that one lookup, not later ones)."""

    def __init__(self, session_ids: list[str], load: Callable[[], Awaitable[None]],
                 settle: Callable[[], None]):
        super().__init__(f"sessions not held here: {quoted(session_ids)}")
        self.session_ids = session_ids
        self.load = load
        self.settle = settle


T = TypeVar("T")
LOADS = 3  # reads from the external store one request may wait for


async def after_loading(miss: SessionMiss, attempt: Callable[[], T]) -> T:
    """``attempt()`` (a lookup that raised ``miss``) again once the sessions it named were
    read from the store; again after a further read if it misses others (a session read
    and evicted meanwhile), up to ``LOADS`` reads, then 503."""
    for _ in range(LOADS):
        await miss.load()
        current = miss
        try:
            return attempt()
        except SessionMiss as again:
            miss = again
        finally:
            current.settle()
    raise StoreUnavailable(f"sessions {quoted(miss.session_ids)} could not be held here (the session cache is full of "
                           "requests in flight); retry later", headers={"Retry-After": "1"})


async def after_loading_all(miss: SessionMiss, attempt: Callable[[], T], reads: int) -> T:
    """``after_loading`` for an attempt that looks up in several places one after the other
    (a multi-agent step: its episode, then each policy's sessions), so that each read
    answers a later lookup than the one that raised it: every read is kept until the
    attempt succeeds (or ``reads`` reads were not enough: 503), then all are settled."""
    done: list[SessionMiss] = []
    try:
        for _ in range(reads):
            await miss.load()
            done.append(miss)
            try:
                return attempt()
            except SessionMiss as again:
                miss = again
        raise StoreUnavailable(f"sessions {miss.session_ids!r} could not be held here (the session cache is full "
                               "of requests in flight); retry later", headers={"Retry-After": "1"})
    finally:
        for read in done:
            read.settle()


class SessionStore(Protocol):
    max_sessions: int
    idle_ttl_s: float
    clock: Callable[[], float]  # the clock ``Session.last_used`` is read from
    durable: bool  # True: await validate/commit around every batch that steps a session
    refusal: str | None  # why no session can be created here (several workers, no shared store)
    layout: SessionLayout  # a session as bytes

    def __len__(self) -> int: ...
    def __contains__(self, session_id: str) -> bool: ...
    def ids(self) -> list[str]: ...

    # lookups (the event loop)
    def get(self, session_id: str) -> Session: ...
    def live(self, session_id: str) -> Session | None: ...
    def knows(self, session_id: str) -> bool: ...

    # lifecycle on the act path (the event loop, synchronous)
    def create(self, session_id: str | None = None, seed: int | None = None) -> Session: ...
    def restart(self, session: Session, seed: int | None) -> None: ...
    def touch(self, session: Session) -> None: ...
    def release(self, session: Session) -> None: ...
    def end(self, session_id: str) -> Session: ...
    def expire_idle(self) -> int: ...
    def clear(self) -> None: ...
    async def close(self) -> None: ...  # after the batcher stopped (an unload)
    def adopt(self, session_id: str, data: bytes) -> Session: ...  # a record read from the store

    # lifecycle from the routes (the event loop; an external store answers over the network)
    async def open_session(self, session_id: str | None, seed: int | None) -> Session: ...
    async def end_session(self, session: Session) -> None: ...
    async def export_session(self, session: Session) -> bytes: ...
    async def import_session(self, session_id: str, record: SessionRecord) -> Session: ...

    # a batch's rows (the batch step; possibly the batcher's thread)
    def gather_rows(self, slots: np.ndarray, reset: np.ndarray, rewards: np.ndarray | None,
                    reported: np.ndarray | None) -> dict[str, np.ndarray]: ...
    def scatter_rows(self, slots: np.ndarray, state_out: list[np.ndarray], actions: np.ndarray | None) -> None: ...

    # around a batch, per request's sessions (the event loop; only when ``durable``)
    async def validate(self, groups: list[list[Session]]) -> list[ServiceError | None]: ...
    # or, for a batch that may run before the store answers: send_validate, the batch, confirm
    async def send_validate(self, groups: list[list[Session]]) -> bool: ...
    async def confirm(self, groups: list[list[Session]]) -> list[ServiceError | bool]: ...
    async def commit(self, groups: list[list[Session]]) -> list[ServiceError | None]: ...
    def discard(self, sessions: list[Session]) -> None: ...
    def forget(self, session: Session) -> None: ...
