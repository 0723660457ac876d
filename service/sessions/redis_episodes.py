"""Multi-agent episodes in Redis or Valkey, with this process's records as the cache.

An episode's record (``rlserve.service.sessions.episode_record``: its seats, seed, joins)
is one key next to the sessions' (``<prefix>:e:<len>:<set>:<episode id>``, the idle TTL as
the key's TTL; an ended episode leaves a tombstone key so its id answers 410). Each agent's
state is an ordinary session of its policy's store, validated and committed with its
batches like any other; the episode's record changes only when its seats do (an episode
starts, an agent joins or finishes, the episode ends), and is written before that step is
answered. Between those writes the record's TTL is renewed in the background, at most once
a quarter of the TTL.

A copy held here is used as it is while its seats stay the same; a step that would change
them first reads the record again (another replica may have seated or finished agents
since), so two replicas serving one episode in turn never seat an agent twice. An episode
not held here (a restart, a failover, a rebalance) is read with one ``MGET`` (record and
tombstone) the way a session is: the lookup raises ``SessionMiss`` and is tried again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable
from typing import Any

from rlserve.service.errors import InternalError, ServiceError, SessionConflict, SessionExpired, StoreUnavailable
from rlserve.service.sessions.base import SessionMiss, after_loading
from rlserve.service.sessions.episode_record import decode_episode, encode_episode
from rlserve.service.sessions.episode_store import Episode, EpisodeStore
from rlserve.service.sessions.record import RecordError
from rlserve.service.sessions.redis_client import RedisSessions

log = logging.getLogger("rlserve.sessions.redis")


class CachedEpisodeStore(EpisodeStore):
    durable = True
    CHECKED_FOR_S = 1.0  # what a read said of an id answers the lookups of the next second

    def __init__(self, store: RedisSessions, set_name: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.store = store
        encoded = set_name.encode("utf-8", "surrogatepass")
        self._prefix = f"{store.prefix}:e:{len(encoded)}:".encode() + encoded + b":"
        self._tomb_prefix = f"{store.prefix}:eg:{len(encoded)}:".encode() + encoded + b":"
        self.ttl_ms = max(1, int(self.idle_ttl_s * 1000))
        self._checked: OrderedDict[str, tuple[float, ServiceError | None, object]] = OrderedDict()
        self._background: set[asyncio.Task] = set()

    def key(self, episode_id: str) -> bytes:
        return self._prefix + episode_id.encode("utf-8", "surrogatepass")

    def tomb(self, episode_id: str) -> bytes:
        return self._tomb_prefix + episode_id.encode("utf-8", "surrogatepass")

    # ------------------------------------------------------------------ lookups (the act path)

    def find(self, episode_id: str) -> Episode:
        episode = self.live(episode_id)
        if episode is not None:
            return episode
        error = self._recent(episode_id)
        if error is not None:
            raise error
        return self.get(episode_id)  # read, and not in the store: 404

    def find_live(self, episode_id: str) -> Episode | None:
        episode = self.live(episode_id)
        if episode is None:
            self._recent(episode_id)  # the store not asked yet: SessionMiss
        return episode

    def require_fresh(self, episode: Episode) -> None:
        """Before a step changes the episode's seats: its record read from the store for
        this very request (``SessionMiss`` reads it again when the copy is older)."""
        if not episode.fresh:
            raise self._miss(episode.id)

    async def lookup(self, episode_id: str) -> Episode:
        """The routes always read the record (another replica may have changed its seats)."""
        return await after_loading(self._miss(episode_id), lambda: self.find(episode_id))

    def _recent(self, episode_id: str) -> ServiceError | None:
        seen = self._checked.get(episode_id)
        if seen is None or time.monotonic() - seen[0] > self.CHECKED_FOR_S:
            raise self._miss(episode_id)
        return seen[1]

    def _miss(self, episode_id: str) -> SessionMiss:
        read = object()

        def settle() -> None:
            seen = self._checked.get(episode_id)
            if seen is not None and seen[2] is read:
                del self._checked[episode_id]
        return SessionMiss([episode_id], lambda: self._load(episode_id, read), settle)

    async def _load(self, episode_id: str, read: object) -> None:
        key, tomb = self.key(episode_id), self.tomb(episode_id)
        data, reason = await self.store.call("load", lambda client: client.mget([key, tomb]))
        now = time.monotonic()
        error: ServiceError | None = None
        if data is not None:
            try:
                record = decode_episode(data)
            except RecordError as exc:
                error = InternalError(f"episode {episode_id!r} in the store is unreadable: {exc}",
                                      field="episode_id", received=episode_id)
            else:
                held = self.live(episode_id)
                if held is not None and held.inflight:  # a request of it runs here: keep that copy
                    held.fresh = True
                else:
                    self.hold(Episode(episode_id, record.seed, now, now, seats=record.seats, joins=record.joins,
                                      steps=record.steps, written=now, fresh=True))
        elif reason is not None:
            self._forget_id(episode_id)
            error = SessionExpired(f"episode {episode_id!r} is gone ({reason.decode('utf-8', 'replace')}); "
                                   "start a new one", field="episode_id", received=episode_id)
        else:
            self._forget_id(episode_id)
        self._checked[episode_id] = (now, error, read)
        self._checked.move_to_end(episode_id)
        while self._checked and now - next(iter(self._checked.values()))[0] > self.CHECKED_FOR_S:
            self._checked.popitem(last=False)

    def _forget_id(self, episode_id: str) -> None:
        held = self._episodes.get(episode_id)
        if held is not None and not held.inflight:
            self.forget(held)

    # ------------------------------------------------------------------ writes

    async def open(self, episode_id: str | None, seed: int | None) -> Episode:
        episode = self.create(episode_id, seed)
        key, data = self.key(episode.id), encode_episode(episode)
        created = await self.store.call("create", lambda client: client.set(key, data, nx=True, px=self.ttl_ms))
        if not created:
            self.forget(episode)
            raise SessionConflict(f"episode {episode.id!r} already exists", field="episode_id", received=episode.id)
        episode.dirty, episode.written = False, self.clock()
        return episode

    def save(self, episode: Episode) -> Awaitable[None] | None:
        episode.dirty = False
        return self._write(episode)

    async def _write(self, episode: Episode) -> None:
        key, tomb, data = self.key(episode.id), self.tomb(episode.id), encode_episode(episode)

        async def run(client: Any) -> Any:
            async with client.pipeline(transaction=True) as pipe:
                pipe.set(key, data, px=self.ttl_ms)
                pipe.delete(tomb)
                return await pipe.execute()
        try:
            await self.store.call("episode", run)
        except StoreUnavailable:
            self.forget(episode)  # read it again next time: the store may not hold these seats
            raise
        episode.written = self.clock()

    def refresh(self, episode: Episode) -> None:
        """Renew the record's TTL in the background, at most once a quarter of it."""
        if self.clock() - episode.written < self.idle_ttl_s / 4:
            return
        episode.written = self.clock()
        key = self.key(episode.id)
        self._spawn(self.store.call("touch", lambda client: client.pexpire(key, self.ttl_ms)))

    def finish(self, episode: Episode) -> Awaitable[None] | None:
        self.end(episode)
        return self._end_stored(episode.id)

    async def _end_stored(self, episode_id: str) -> None:
        key, tomb = self.key(episode_id), self.tomb(episode_id)

        async def run(client: Any) -> Any:
            async with client.pipeline(transaction=True) as pipe:
                pipe.delete(key)
                pipe.set(tomb, b"ended by the client", px=self.ttl_ms)
                return await pipe.execute()
        await self.store.call("end", run)

    def _spawn(self, coroutine: Any) -> None:
        async def quietly() -> None:
            try:
                await coroutine
            except StoreUnavailable as exc:  # renewed with the next write or refresh
                log.warning("renewing an episode's TTL failed: %s", exc.message)
        task = asyncio.get_running_loop().create_task(quietly())
        self._background.add(task)
        task.add_done_callback(self._background.discard)
