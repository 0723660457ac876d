"""The connection to Redis/Valkey: its scripts sent on pooled connections, one batch's
watched transaction, and the keys of one model name's sessions.

``RedisSessions`` is shared by every model of a process (one client per event loop);
``ModelSessions`` names one model's keys and does the single-session calls (read a
request's records, create, import, end). How the batches use them is the store's
(``rlserve.service.sessions.redis_store``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from rlserve.service.errors import StoreUnavailable
from rlserve.service.sessions.redis_scripts import COMMIT_LUA, TTL_LUA, VALIDATE_LUA

log = logging.getLogger("rlserve.sessions.redis")
FAILURE_LOG_S = 10.0  # a store that stays down is logged this often, not once per request

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
    """What the store reports (``rlserve.service.engine.metrics.Metrics`` implements it)."""

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
        self._failures, self._failure_logged = 0, -FAILURE_LOG_S

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
            self._log_failure(exc)
            # The client learns what happened, not where: the store's address and the
            # library's message (which names it) are the log's.
            raise StoreUnavailable(
                f"the session store did not answer ({type(exc).__name__}); nothing was changed by this request "
                "unless it says otherwise; retry later", headers={"Retry-After": "1"}) from exc
        finally:
            if self.observer is not None and op is not None:
                self.observer.store_call(op, time.perf_counter() - started)

    def _log_failure(self, exc: BaseException) -> None:
        """Log a failed call with the store's address (at most every ``FAILURE_LOG_S``,
        with the count since: a store that is down fails every request)."""
        self._failures += 1
        now = time.monotonic()
        if now - self._failure_logged >= FAILURE_LOG_S:
            log.warning("the session store %s did not answer (%d failed calls since the last report): %s: %s",
                        redacted(self.url), self._failures, type(exc).__name__, exc)
            self._failure_logged, self._failures = now, 0

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
