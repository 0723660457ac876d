"""The external session store: Redis or Valkey, with this process's slabs as its cache.

Every replica (or worker) that shares one Redis and one model repository can serve every
session. One key per session holds its record (``rlserve.service.sessions.record``) with
the idle deadline as the key's TTL; an ended session leaves a small tombstone key so its
id answers 410. Per batch of a model version the store is touched twice, each one round
trip for all the batch's sessions, never a call per session (a third only when Redis
refuses the transaction below, or lost its scripts):

- ``validate`` (around the runtime call): ``WATCH`` on the batch's session keys and, in
  the same round trip, a script asking for each session held here "is your revision
  still the one I hold?"; the store answers 0 or the newer record, which replaces the
  copy held here (another replica stepped the session since). The connection keeps its
  ``WATCH`` until the commit. When every session of the batch has a copy here from an
  earlier step (the usual batch), the validate is only sent before the runtime call and
  its answer read after it (``send_validate``, ``confirm``): the few requests whose
  sessions had moved on are restored from the records it returns and run again. With
  ``RLSERVE_SESSION_CACHE=trust`` no validate is sent (the load balancer routes each
  session to one replica; a stale copy is still caught by the write).
- ``commit`` (after it, before any answer is sent): each request's sessions are written
  only if the store still holds the revisions they were computed from, so two replicas
  stepping one session can never fork it. After a validate, that is Redis's own optimistic
  lock: ``MULTI``, one ``MSET`` of the records, their TTLs, ``EXEC``, which Redis refuses
  if any watched key changed since. The records then never pass through Lua, which costs
  Redis several times more than storing them (``docs/benchmarks.md``). When ``EXEC``
  refuses, without a validate (``trust``), or with a session new to the store in the batch
  (sent with ``UNWATCH``), the commit script compares each request's revisions itself
  (compare-and-set, all of one request or none of it). A request that lost answers 409
  and its sessions' copies are dropped here.

A session not held here (after a restart, a failover, a rebalance) is read by the
registry with one ``MGET`` for all the ids of a request (``ModelSessions.fetch``) and
adopted into the cache. Expiry and eviction only forget the copy held here: the TTL in
the store decides when a session is gone.
"""

from __future__ import annotations

import asyncio
import logging
import random
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlserve.service.errors import (
    ServiceError,
    SessionBusy,
    SessionConflict,
    SessionExpired,
    StoreUnavailable,
    quoted,
)
from rlserve.service.sessions.record import (
    RecordError,
    SessionRecord,
    encode_sessions,
    revision_bytes,
)
from rlserve.service.sessions.redis_client import ModelSessions, RedisSessions, StoreObserver
from rlserve.service.sessions.redis_scripts import VALIDATE_LUA
from rlserve.service.sessions.store import Session, SessionStore

log = logging.getLogger("rlserve.sessions.redis")

__all__ = ["CachedSessionStore", "ModelSessions", "RedisSessions"]


class CachedSessionStore(SessionStore):
    """Sessions of one model version in Redis/Valkey, with the in-process slabs as cache.

    Lookups and the act path's bookkeeping are the in-process store's (this process's
    copies); ``validate``/``commit`` around each batch and the async lifecycle calls below
    keep the external store the one authority."""

    durable = True
    remembers_idle = False

    def __init__(self, *args: Any, remote: ModelSessions, trust_cache: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.remote = remote
        self.trust_cache = trust_cache
        self.ttl_ms = max(1, int(self.idle_ttl_s * 1000))
        self._ending: set[asyncio.Task] = set()  # ends from the act path, being written
        # Between a batch's validate and its commit: the connection holding the WATCH and
        # the sessions it covers.
        self._watch: tuple[Any, set[Session]] | None = None
        # Between ``send_validate`` and ``confirm``: the send's seconds, the keys and the
        # script's arguments (the connection is the watch's).
        self._sent: tuple[float, list[bytes], list[bytes]] | None = None

    @property
    def observer(self) -> StoreObserver | None:
        return self.remote.store.observer

    # ------------------------------------------------------------------ lookups

    def live(self, session_id: str) -> Session | None:
        session = self._sessions.get(session_id)
        if session is None:
            return None
        if session.inflight or self.clock() - session.last_used <= self.idle_ttl_s:
            return session
        self.forget(session)  # an idle copy: the store's TTL says whether the session lives
        return None

    def knows(self, session_id: str) -> bool:
        """Only ids ended here are known gone; anything else is the store's to say."""
        return session_id in self._tombstones

    # ------------------------------------------------------------------ the cache

    def create(self, session_id: str | None = None, seed: int | None = None) -> Session:
        """A session new to this replica (the act path): written with the batch's commit,
        which refuses it (409) if the store has a session of that id by then."""
        session = super().create(session_id, seed)
        session.revision = random.getrandbits(64)
        return session

    def end(self, session_id: str) -> Session:
        """End a session from the act path (a protocol's ``sequence_end``, after its step was
        committed and answered): dropped here at once, deleted from the store (with its
        tombstone) right after, in the background. Should this process die in between, the
        store's copy expires after its idle TTL."""
        session = super().end(session_id)
        task = asyncio.get_running_loop().create_task(self._end_stored(session_id))
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)
        return session

    async def _end_stored(self, session_id: str) -> None:
        try:
            await self.remote.end(session_id, "ended by the client", self.ttl_ms)
        except StoreUnavailable as exc:
            log.warning("ending session %r in the store failed (it expires after its idle TTL): %s",
                        session_id, exc.message)

    def adopt(self, session_id: str, data: bytes) -> Session:
        """Hold the store's record of ``session_id`` here (``RecordError`` if it does not fit)."""
        session = super().adopt(session_id, data)
        session.revision = int.from_bytes(data[:8], "big")
        session.persisted, session.fresh = True, True
        return session

    def discard(self, sessions: list[Session]) -> None:
        """A batch failed after it may have changed these copies: read them again next time."""
        for session in sessions:
            self.forget(session)

    # ------------------------------------------------------------------ around a batch

    async def validate(self, groups: list[list[Session]]) -> list[ServiceError | None]:
        """Bring each request's sessions up to the store's revision; per request None or why not.

        Also watches every session checked, so that the commit can write them with a plain
        transaction (see the module's docstring); sessions read from the store for this
        very request are checked again for that (they are not counted as cache hits)."""
        await self._drop_watch()  # a batch that never reached its commit (cancelled)
        errors: list[ServiceError | None] = [None] * len(groups)
        checked: list[list[Session]] = []
        fresh: set[Session] = set()
        held = 0
        for group in groups:
            checked.append([])
            for session in group:
                if session.fresh:  # read from the store for this very request
                    session.fresh = False
                    fresh.add(session)
                    checked[-1].append(session)
                elif session.persisted:
                    checked[-1].append(session)
                    held += 1
        if not held or self.trust_cache:
            if held and self.observer is not None:
                self.observer.session_cache(held, 0)
            return errors
        store = self.remote.store
        keys, args = self._validate_args(checked)
        if store.can_watch:
            conn, replies = await store.watch(keys, args)
        else:  # no hiredis (not the [redis] extra): validate without a lock
            conn, replies = None, await store.script("validate", keys, args, "validate")
        answers = iter(replies)
        misses = 0
        for index, group in enumerate(checked):
            for session in group:
                reply = next(answers)
                if reply == 0:
                    continue
                revision = session.revision
                error = self._refresh(session, reply)
                if error is not None:
                    errors[index] = error
                if session not in fresh and (error is not None or session.revision != revision):
                    misses += 1
        if self.observer is not None:
            self.observer.session_cache(held - misses, misses)
        if conn is not None:
            if all(error is not None for error in errors):
                await store.unwatch(conn)
            else:
                self._watch = (conn, {s for group in checked for s in group})
        return errors

    def _validate_args(self, groups: list[list[Session]]) -> tuple[list[bytes], list[bytes]]:
        sessions = [s for group in groups for s in group]
        return ([self.remote.key(s.id) for s in sessions],
                [b"".join(revision_bytes(s.revision) for s in sessions),
                 struct.pack(f"<{len(groups)}I", *(len(g) for g in groups))])

    # A batch that runs before its validate answers: ``send_validate`` before the runtime
    # call, ``confirm`` after it and before ``commit``.

    async def send_validate(self, groups: list[list[Session]]) -> bool:
        """Send the validate (and its WATCH) of a batch whose every session has a copy held
        here since an earlier step, without waiting for the answer: the batch runs on those
        copies meanwhile, and ``confirm`` reads the answer. False, nothing sent, if the
        batch does not qualify; the caller then awaits ``validate`` before running it."""
        if self.trust_cache or not self.remote.store.can_watch:
            return False
        count = 0
        for group in groups:
            for session in group:
                if session.fresh or not session.persisted:
                    return False
                count += 1
        if not count:
            return False
        await self._drop_watch()
        keys, args = self._validate_args(groups)
        conn, sent_s = await self.remote.store.watch_send(keys, args)
        self._watch = (conn, {s for group in groups for s in group})
        self._sent = (sent_s, keys, args)
        return True

    async def confirm(self, groups: list[list[Session]]) -> list[ServiceError | bool]:
        """After ``send_validate`` and the batch: per request False when its copies were
        current (its answer stands), True when a session of it had moved on elsewhere (its
        copies now hold the store's records again: run it again, an episode restart with
        it), or why it cannot run (its copies are dropped)."""
        sent, self._sent = self._sent, None
        watch, self._watch = self._watch, None  # whatever happens below gives its connection back
        assert sent is not None and watch is not None
        (conn, sessions), (sent_s, keys, args) = watch, sent
        try:
            replies = await self.remote.store.watch_read(conn, sent_s)
            if replies is None:  # the server lost the script: load it, watch and validate again
                await self.remote.store.call(None, lambda client: client.script_load(VALIDATE_LUA))
                conn, replies = await self.remote.store.watch(keys, args)
        except StoreUnavailable as exc:
            self.discard([s for group in groups for s in group])  # the batch moved them
            return [exc if group else False for group in groups]
        self._watch = (conn, sessions)
        verdicts: list[ServiceError | bool] = [False] * len(groups)
        answers = iter(replies)
        hits = misses = 0
        for index, group in enumerate(groups):
            records = [next(answers) for _ in group]
            if all(record == 0 for record in records):
                hits += len(group)
                continue
            verdict: ServiceError | bool = True
            for session, record in zip(group, records, strict=True):
                held = session.revision
                error = self._refresh(session, record)
                if error is not None:  # counted as ``validate`` counts it
                    verdict = error
                    misses += 1
                    continue
                misses += session.revision != held
                hits += session.revision == held
            if verdict is not True:
                self.discard(group)
            verdicts[index] = verdict
        if self.observer is not None:
            self.observer.session_cache(hits, misses)
        return verdicts

    def _refresh(self, session: Session, data: bytes) -> ServiceError | None:
        """Replace the stale copy of ``session`` with the store's ``data`` (b"": none)."""
        if not data:
            self.forget(session)
            return SessionExpired(f"session {session.id!r} is gone: it ended or expired elsewhere (another "
                                  "replica or worker); start a new episode", field="session_id", received=session.id)
        try:
            record = self.layout.decode(data)
            if record.version != self.version:
                raise RecordError(f"it is now bound to version {record.version!r}")
        except RecordError as exc:
            self.forget(session)
            return SessionBusy(f"session {session.id!r} was replaced elsewhere ({exc}); retry the request",
                               field="session_id", received=session.id)
        with self.slabs.lock:
            self.slabs.put_rows(np.array([session.slot]), [row[None] for row in record.rows])
        session.revision, session.persisted = record.revision, True
        session.steps, session.seed, session.rng, session.answer = record.steps, record.seed, record.rng, record.answer
        session.trail = record.trail
        return None

    async def commit(self, groups: list[list[Session]]) -> list[ServiceError | None]:
        """Write each request's sessions if the store still holds what they were computed
        from; per request None, or 409 (its copies are dropped here)."""
        watch, self._watch = self._watch, None
        errors: list[ServiceError | None] = [None] * len(groups)
        sessions = [s for group in groups for s in group]
        if not sessions:
            if watch is not None:
                await self.remote.store.unwatch(watch[0])
            return errors
        records = self._records(sessions, [(s.revision + 1) & ((1 << 64) - 1) for s in sessions])
        keys = [self.remote.key(s.id) for s in sessions]
        watching = None
        if watch is not None:
            conn, watched = watch
            if watched.issuperset(sessions):
                try:
                    written = await self.remote.store.transact(conn, keys, records, self.ttl_ms)
                except StoreUnavailable as exc:
                    self.discard(sessions)  # written or not: read them again next time
                    return [exc if group else None for group in groups]
                if written:
                    self._committed(groups, errors)
                    return errors
                # EXEC refused: a session changed since the validate. The script below
                # tells which requests lost (and writes the others).
            else:  # a session new to the store is in the batch: the script checks it is absent
                watching = conn
        args = [self.ttl_ms, struct.pack(f"<{len(groups)}I", *(len(g) for g in groups)),
                b"".join(revision_bytes(s.revision) for s in sessions),
                bytes(48 if s.persisted else 49 for s in sessions),  # "0": must hold it, "1": none yet
                *records]
        try:
            if watching is not None:
                lost = await self.remote.store.unwatch_script(watching, "commit", keys, args, "commit")
            else:
                lost = await self.remote.store.script("commit", keys, args, "commit")
        except StoreUnavailable as exc:
            self.discard(sessions)  # written or not: read them again next time
            return [exc if group else None for group in groups]
        for number in lost:
            group = groups[int(number) - 1]
            errors[int(number) - 1] = _conflict(group)
            self.discard(group)
        self._committed(groups, errors)
        if lost and self.observer is not None:
            self.observer.session_conflicts(len(lost))
        return errors

    @staticmethod
    def _committed(groups: list[list[Session]], errors: list[ServiceError | None]) -> None:
        """The copies of every request written by a commit now match the store."""
        for index, group in enumerate(groups):
            if errors[index] is None:
                for session in group:
                    session.revision = (session.revision + 1) & ((1 << 64) - 1)
                    session.persisted = True

    async def close(self) -> None:
        """The batcher stopped (an unload), maybe inside a batch: close a watching connection
        the batch still held, which nothing else would give back to the pool."""
        await self._drop_watch()

    async def _drop_watch(self) -> None:
        watch, self._watch, self._sent = self._watch, None, None
        if watch is not None:
            await self.remote.store.drop(watch[0])

    def _records(self, sessions: Sequence[Session], revisions: Sequence[int]) -> list[bytes]:
        slots = np.fromiter((s.slot for s in sessions), np.int64, len(sessions))
        with self.slabs.lock:
            rows = self.slabs.rows(slots)
        return encode_sessions(self.layout, self.version, sessions, revisions, rows, self.clock())

    # ------------------------------------------------------------------ lifecycle (the API)

    async def open_session(self, session_id: str | None, seed: int | None) -> Session:
        session = self.create(session_id, seed)
        record = self._records([session], [session.revision])[0]
        try:
            created = await self.remote.create(session.id, record, self.ttl_ms)
        except StoreUnavailable:
            self.forget(session)
            raise
        if not created:
            self.forget(session)
            raise SessionConflict(f"session {session.id!r} already exists", field="session_id", received=session.id)
        session.persisted = True
        return session

    async def end_session(self, session: Session) -> None:
        await self.remote.end(session.id, "ended by the client", self.ttl_ms)
        self._drop(session, "ended by the client")

    async def export_session(self, session: Session) -> bytes:
        data = await self.remote.get(session.id)
        if data is None:
            raise SessionExpired(f"session {session.id!r} is gone: it ended or expired elsewhere",
                                 field="session_id", received=session.id)
        return data

    async def import_session(self, session_id: str, record: SessionRecord) -> Session:
        session = self._replace(session_id, record)  # 409 while a request of it is in flight here
        session.revision = random.getrandbits(64)  # a new history: no copy held anywhere matches it
        data = self._records([session], [session.revision])[0]
        try:
            await self.remote.put(session.id, data, self.ttl_ms)
        except StoreUnavailable:
            self.forget(session)
            raise
        session.persisted, session.fresh = True, False
        return session


def _conflict(group: list[Session]) -> SessionBusy:
    ids = [s.id for s in group]
    named = quoted(ids[0]) if len(ids) == 1 else f"one of {quoted(ids)}"
    return SessionBusy(
        f"session {named} was changed elsewhere (another replica or worker stepped, ended or replaced it) "
        "while this step ran; this step was not applied and the copy held here was dropped: retry it",
        field="session_id", expected="the session as stored when the step began", received=ids[0])
