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
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from rlserve.service.errors import (
    ServiceError,
    SessionConflict,
    SessionExpired,
    StoreUnavailable,
)
from rlserve.service.sessions.record import (
    RecordError,
    SessionRecord,
    encode_sessions,
    revision_bytes,
)
from rlserve.service.sessions.store import Session, SessionStore

log = logging.getLogger("rlserve.sessions.redis")

# Both scripts take their small per-session values packed into one argument each
# (fixed-width fields read with string.sub and struct.unpack) rather than one argument per
# value: the client's cost of a command grows with its argument count. The records of a
# commit stay one argument each (cutting them out of one long string costs the script more).

# What both scripts must agree on: a group of keys (one request's sessions, KEYS[first]
# to KEYS[last]) is current when every key holds the 8-byte revision ``expected`` has for
# it (its record's first 8 bytes), or no record at all where ``absent`` marks it "1" (a
# session new to the store; nil: none is). As a shared function it costs Redis ~4 us more
# per validate of 64 one-session requests than the rule written into each script (94-96
# against 89-94 us); one copy of the rule is worth that.
_CURRENT_LUA = """
local function current(first, last, expected, absent)
  for i = first, last do
    local want = ''
    if absent == nil or string.byte(absent, i) == 48 then
      want = string.sub(expected, 8 * i - 7, 8 * i)
    end
    if redis.call('GETRANGE', KEYS[i], 0, 7) ~= want then
      return false
    end
  end
  return true
end
"""

# KEYS: the batch's session keys, grouped by request. ARGV[1]: the TTL in ms; ARGV[2]: each
# group's size (u32 LE); ARGV[3]: per key the 8-byte revision it must hold; ARGV[4]: per key
# "1" when it must hold no record yet (a session new to the store), else "0"; ARGV[4 + i]:
# the new record of KEYS[i]. A group (one request's sessions) is written only when every
# key of it matches. Returns the (1-based) numbers of the groups that were not written.
COMMIT_LUA = _CURRENT_LUA + """
local ttl, sizes, expected, absent = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local lost = {}
local last = 0
for g = 1, #sizes / 4 do
  local first = last + 1
  last = last + struct.unpack('<I4', sizes, 4 * g - 3)
  if current(first, last, expected, absent) then
    for i = first, last do
      redis.call('SET', KEYS[i], ARGV[4 + i], 'PX', ttl)
    end
  else
    lost[#lost + 1] = g
  end
end
return lost
"""

# KEYS: sessions held by the caller, grouped by request; ARGV[1]: the 8-byte revision it
# holds of each, one after the other; ARGV[2]: each group's size (u32 LE). Returns per key 0
# when the store holds that revision, else the store's record ("" when it has none). A
# group with any key not current gets every key's record: a batch that ran before this
# answer came back (``CachedSessionStore.confirm``) restores the whole request from them.
VALIDATE_LUA = _CURRENT_LUA + """
local held, sizes = ARGV[1], ARGV[2]
local out = {}
local last = 0
for g = 1, #sizes / 4 do
  local first = last + 1
  last = last + struct.unpack('<I4', sizes, 4 * g - 3)
  local ok = current(first, last, held, nil)
  for i = first, last do
    if ok then
      out[i] = 0
    else
      out[i] = redis.call('GET', KEYS[i]) or ''
    end
  end
end
return out
"""


# KEYS: the keys a transaction's MSET just wrote; ARGV[1]: their TTL in ms. Sent with EVAL
# (not EVALSHA) inside MULTI: a script the server lost would otherwise fail only at EXEC,
# after the MSET had stored the records without their TTLs.
TTL_LUA = """
for i = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ARGV[1])
end
return #KEYS
"""

_pack_command: Callable[[tuple[Any, ...]], bytes] | None
try:  # the [redis] extra installs hiredis; without it, redis-py packs commands itself
    from hiredis import pack_command as _pack_command
except ImportError:  # pragma: no cover - hiredis ships with the extra
    _pack_command = None


async def _evalsha(client: Any, sha: str, keys: Sequence[bytes], args: Sequence[Any]) -> Any:
    """EVALSHA of a batch's script, packed by hiredis in one call and sent on a pooled
    connection with redis-py's own send, read and retry policy (both drop the connection
    on any error). A batch's commit has ~130 arguments; redis-py's generic command path
    encodes them one by one in Python, which cost ~0.3 ms of the event loop per batch."""
    assert _pack_command is not None  # script() takes this path only with hiredis
    packed = _pack_command((b"EVALSHA", sha, len(keys), *keys, *args))
    pool = client.connection_pool
    conn = await pool.get_connection()
    try:
        return await _send_and_read(conn, packed, 1)
    finally:
        await pool.release(conn)


_MULTI, _EXEC, _UNWATCH = ((_pack_command((b"MULTI",)), _pack_command((b"EXEC",)), _pack_command((b"UNWATCH",)))
                            if _pack_command is not None else (b"", b"", b""))


async def _drop(pool: Any, conn: Any) -> None:
    """Close ``conn`` (a half-read reply or a WATCH must not reach its next user) and give it back."""
    try:
        await conn.disconnect()
    finally:
        await pool.release(conn)


async def _send(conn: Any, packed: bytes) -> None:
    """Send ``packed`` on ``conn``, once more on a new connection if it was broken."""
    async def dropped(error: Exception) -> None:
        await conn.disconnect()

    await conn.retry.call_with_retry(lambda: conn.send_packed_command(packed), dropped)


async def _send_and_read(conn: Any, packed: bytes, replies: int) -> Any:
    """Send ``packed`` on ``conn`` and read ``replies`` replies, the last one returned, with
    redis-py's retry policy (a broken connection is closed, so a WATCH among the commands
    goes with it, and everything is sent again)."""
    async def once() -> Any:
        await conn.send_packed_command(packed)
        for _ in range(replies - 1):
            await conn.read_response()
        return await conn.read_response()

    async def dropped(error: Exception) -> None:
        await conn.disconnect()

    return await conn.retry.call_with_retry(once, dropped)


class StoreObserver(Protocol):
    """What the store reports (``rlserve.service.serving.metrics.Metrics`` implements it)."""

    def store_call(self, op: str, seconds: float) -> None: ...
    def session_cache(self, hits: int, misses: int) -> None: ...
    def session_conflicts(self, count: int) -> None: ...


def redacted(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


class RedisSessions:
    """The connection to Redis/Valkey and its two scripts, shared by every model of a process."""

    def __init__(self, url: str, *, prefix: str = "rlserve", timeout_s: float = 2.0,
                 observer: StoreObserver | None = None):
        import redis  # the [redis] extra; imported only when a store is configured

        self.url = url
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.observer = observer
        self._redis = redis
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scripts: dict[str, Any] = {}

    def client(self) -> Any:
        """The client of the running event loop (a redis.asyncio client belongs to one loop)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            from redis.asyncio import Redis
            from redis.asyncio.retry import Retry
            from redis.backoff import ExponentialBackoff

            # A connection that broke before the command went out is retried once; a
            # timeout is not (the script may have run: the compare-and-set decides then).
            retry = Retry(ExponentialBackoff(cap=0.05, base=0.005), 1,
                          supported_errors=(self._redis.exceptions.ConnectionError,))
            self._client = Redis.from_url(self.url, socket_timeout=self.timeout_s,
                                          socket_connect_timeout=self.timeout_s, retry=retry)
            self._loop = loop
            self._scripts = {"commit": self._client.register_script(COMMIT_LUA),
                             "validate": self._client.register_script(VALIDATE_LUA)}
        return self._client

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None and self._loop is asyncio.get_running_loop():
            await client.aclose()

    def for_model(self, model: str) -> ModelSessions:
        return ModelSessions(self, model)

    async def call(self, op: str | None, fn: Any, earlier_s: float = 0.0) -> Any:
        """Run ``fn(client)`` (one round trip), timed as ``op`` (plus ``earlier_s`` spent on
        it before; None: not timed), with store failures as 503."""
        started = time.perf_counter() - earlier_s
        try:
            return await fn(self.client())
        except (self._redis.exceptions.RedisError, OSError) as exc:
            raise StoreUnavailable(
                f"the session store {redacted(self.url)} did not answer ({type(exc).__name__}: {exc}); "
                "nothing was changed by this request unless it says otherwise; retry later",
                headers={"Retry-After": "1"}) from exc
        finally:
            if self.observer is not None and op is not None:
                self.observer.store_call(op, time.perf_counter() - started)

    async def script(self, name: str, keys: Sequence[bytes], args: Sequence[Any], op: str) -> Any:
        async def run(client: Any) -> Any:
            script = self._scripts[name]
            if _pack_command is not None:
                try:
                    return await _evalsha(client, script.sha, keys, args)
                except self._redis.exceptions.NoScriptError:
                    pass  # the server lost its scripts (a restart): redis-py's Script loads it again
            return await script(keys=keys, args=args)
        return await self.call(op, run)

    async def unwatch_script(self, conn: Any, name: str, keys: Sequence[bytes], args: Sequence[Any], op: str) -> Any:
        """``UNWATCH`` on ``conn`` (from ``watch``, given back here) and the script ``name``
        after it, in one round trip: a commit that cannot be a transaction."""
        assert _pack_command is not None
        packed = _UNWATCH + _pack_command((b"EVALSHA", self._scripts[name].sha, len(keys), *keys, *args))

        async def run(client: Any) -> Any:
            pool = client.connection_pool
            try:
                await conn.send_packed_command(packed, check_health=False)
                await conn.read_response()  # OK
                result = await conn.read_response()
            except self._redis.exceptions.NoScriptError:  # read whole: the connection is clean
                await pool.release(conn)
                return await self._scripts[name](keys=keys, args=args)  # loads it
            except BaseException:
                await _drop(pool, conn)
                raise
            await pool.release(conn)
            return result
        return await self.call(op, run)

    # A batch's optimistic lock: ``watch`` before the runtime call, ``transact`` (or
    # ``unwatch``, ``unwatch_script``) after it, on one connection taken from the pool for the batch.

    @property
    def can_watch(self) -> bool:
        return _pack_command is not None

    def _watch_packed(self, keys: Sequence[bytes], args: Sequence[bytes]) -> bytes:
        assert _pack_command is not None
        sha = self._scripts["validate"].sha
        return _pack_command((b"WATCH", *keys)) + _pack_command((b"EVALSHA", sha, len(keys), *keys, *args))

    async def watch(self, keys: Sequence[bytes], args: Sequence[bytes]) -> tuple[Any, list[Any]]:
        """``WATCH keys`` and the validate script over them (``args``: its ARGV), one round
        trip. Returns the connection, which keeps the ``WATCH`` and belongs to the caller
        until ``transact`` or ``unwatch``, and the script's replies. A server that lost the
        script (a restart, a failover) is given it again and asked once more."""

        async def run(client: Any) -> tuple[Any, list[Any]]:
            packed = self._watch_packed(keys, args)
            pool = client.connection_pool
            for attempt in range(2):
                conn = await pool.get_connection()
                try:
                    return conn, await _send_and_read(conn, packed, 2)
                except self._redis.exceptions.NoScriptError:
                    await _drop(pool, conn)
                    if attempt:
                        raise
                    await client.script_load(VALIDATE_LUA)
                except BaseException:
                    await _drop(pool, conn)
                    raise
            raise AssertionError("unreachable")
        return await self.call("validate", run)

    async def watch_send(self, keys: Sequence[bytes], args: Sequence[bytes]) -> tuple[Any, float]:
        """The first half of ``watch``: send, do not wait. Returns the connection (the
        caller's until ``watch_read``) and the seconds the send took."""
        started = time.perf_counter()

        async def run(client: Any) -> Any:
            packed = self._watch_packed(keys, args)
            pool = client.connection_pool
            conn = await pool.get_connection()
            try:
                await _send(conn, packed)
            except BaseException:
                await _drop(pool, conn)
                raise
            return conn
        conn = await self.call(None, run)  # timed with its read (``watch_read``)
        return conn, time.perf_counter() - started

    async def watch_read(self, conn: Any, sent_s: float) -> list[Any] | None:
        """The second half: the validate script's replies, ``conn`` kept with its WATCH
        (as from ``watch``); None, ``conn`` given back, if the server lost the script."""

        async def run(client: Any) -> list[Any] | None:
            pool = client.connection_pool
            try:
                await conn.read_response()  # OK
                return await conn.read_response()
            except self._redis.exceptions.NoScriptError:
                await _drop(pool, conn)
                return None
            except BaseException:
                await _drop(pool, conn)
                raise
        return await self.call("validate", run, sent_s)

    async def transact(self, conn: Any, keys: Sequence[bytes], records: Sequence[bytes], ttl_ms: int) -> bool:
        """Write ``records`` to ``keys`` with their TTL in one ``MULTI``/``EXEC`` on ``conn``
        (from ``watch``, which it releases). False: ``EXEC`` refused, a watched key changed
        (nothing was written). Never retried: a failure after the send may have written."""
        assert _pack_command is not None
        mset: list[Any] = [b"MSET"]
        for key, record in zip(keys, records, strict=True):
            mset += (key, record)
        packed = (_MULTI + _pack_command(tuple(mset)) + _pack_command((b"EVAL", TTL_LUA, len(keys), *keys, ttl_ms))
                  + _EXEC)

        async def run(client: Any) -> bool:
            pool, done = client.connection_pool, False
            try:
                if not conn.is_connected:  # a new connection would hold no WATCH
                    raise self._redis.exceptions.ConnectionError("the watching connection was closed")
                await conn.send_packed_command(packed, check_health=False)
                for _ in range(3):  # OK, QUEUED, QUEUED
                    await conn.read_response()
                result = await conn.read_response()
                done = True
            finally:
                if done:
                    await pool.release(conn)
                else:
                    await _drop(pool, conn)
            if result is None:
                return False
            if isinstance(result[-1], Exception) or result[-1] != len(keys):
                # The records are written (the step happened: it is answered), only their
                # idle deadlines are not; the next commit of each session sets it again.
                log.error("%d session records were written but setting their TTLs failed: %r", len(keys),
                          result[-1])
            return True
        return await self.call("commit", run)

    async def unwatch(self, conn: Any) -> None:
        """Give back a connection from ``watch`` without a transaction."""
        try:
            pool = self.client().connection_pool
        except RuntimeError:  # no running loop (should not happen): just close it
            await conn.disconnect()
            return
        try:
            await conn.send_packed_command(_UNWATCH, check_health=False)
            await conn.read_response()
        except (self._redis.exceptions.RedisError, OSError):
            await _drop(pool, conn)
            return
        await pool.release(conn)

    async def drop(self, conn: Any) -> None:
        """Close a connection from ``watch`` (its WATCH ends with it) and give it back."""
        await _drop(self.client().connection_pool, conn)


class ModelSessions:
    """The keys of one model name's sessions (ids are unique per model name across versions)."""

    def __init__(self, store: RedisSessions, model: str):
        self.store = store
        self.model = model
        encoded = model.encode("utf-8", "surrogatepass")
        # The name's length keeps "a:b" + "c" apart from "a" + "b:c".
        self._session_prefix = f"{store.prefix}:s:{len(encoded)}:".encode() + encoded + b":"
        self._tomb_prefix = f"{store.prefix}:g:{len(encoded)}:".encode() + encoded + b":"

    def key(self, session_id: str) -> bytes:
        return self._session_prefix + session_id.encode("utf-8", "surrogatepass")

    def tomb(self, session_id: str) -> bytes:
        return self._tomb_prefix + session_id.encode("utf-8", "surrogatepass")

    async def fetch(self, session_ids: Sequence[str]) -> list[tuple[bytes | None, str | None]]:
        """(record or None, tombstone reason or None) per id, in one round trip."""
        keys = [self.key(s) for s in session_ids] + [self.tomb(s) for s in session_ids]
        values = await self.store.call("load", lambda client: client.mget(keys))
        n = len(session_ids)
        return [(values[i], None if values[n + i] is None else values[n + i].decode("utf-8", "replace"))
                for i in range(n)]

    async def get(self, session_id: str) -> bytes | None:
        key = self.key(session_id)
        return await self.store.call("export", lambda client: client.get(key))

    async def create(self, session_id: str, record: bytes, ttl_ms: int) -> bool:
        key = self.key(session_id)
        return bool(await self.store.call("create", lambda client: client.set(key, record, nx=True, px=ttl_ms)))

    async def put(self, session_id: str, record: bytes, ttl_ms: int) -> None:
        key, tomb = self.key(session_id), self.tomb(session_id)

        async def run(client: Any) -> Any:
            async with client.pipeline(transaction=True) as pipe:
                pipe.set(key, record, px=ttl_ms)
                pipe.delete(tomb)
                return await pipe.execute()
        await self.store.call("import", run)

    async def end(self, session_id: str, reason: str, ttl_ms: int) -> None:
        key, tomb = self.key(session_id), self.tomb(session_id)

        async def run(client: Any) -> Any:
            async with client.pipeline(transaction=True) as pipe:
                pipe.delete(key)
                pipe.set(tomb, reason.encode(), px=ttl_ms)
                return await pipe.execute()
        await self.store.call("end", run)


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
            return SessionConflict(f"session {session.id!r} was replaced elsewhere ({exc}); retry the request",
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


def _conflict(group: list[Session]) -> SessionConflict:
    ids = [s.id for s in group]
    named = repr(ids[0]) if len(ids) == 1 else f"one of {ids!r}"
    return SessionConflict(
        f"session {named} was changed elsewhere (another replica or worker stepped, ended or replaced it) "
        "while this step ran; this step was not applied and the copy held here was dropped: retry it",
        field="session_id", expected="the session as stored when the step began", received=ids[0])
