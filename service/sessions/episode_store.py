"""Multi-agent episodes: a record of per-agent sessions, in process (the default store).

A policy set's episode (``rlserve.service.multiagent``) is one multi-agent session. Each
agent that acts in it has a session of its own in the store of the policy it maps to,
exactly as a single-agent session (recurrent state, previous action and reward, seeded
sampler), under an id derived from the episode's (``agent_session_id``). The episode itself
only records which agents have state and where: its ``Seat`` per agent (policy id and
session id), the seed the agents' samplers derive theirs from
(``rlserve.service.multiagent.episode_plan.derive_seed``), and how often each agent joined
(an agent that finished and acts again starts afresh, with a seed of its own).

``EpisodeStore`` keeps these records for one policy set in this process, in
least-recently-used order, with the idle TTL and cap of the session stores and tombstones
so an ended or expired episode answers 410. ``rlserve.service.sessions.redis_episodes``
keeps them in Redis or Valkey instead (with these as the cache).
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from rlserve.service.errors import (
    BadRequest,
    QueueFull,
    SessionConflict,
    SessionExpired,
    SessionNotFound,
    SessionsUnavailable,
)
from rlserve.service.sessions.store import MAX_SESSION_ID_LENGTH

MAX_AGENT_ID_LENGTH = 64


@dataclass(slots=True)
class Seat:
    """One agent with state in an episode: the policy acting for it and its session there."""

    policy: str
    session_id: str


@dataclass(eq=False)
class Episode:
    id: str
    seed: int | None
    created: float
    last_used: float
    seats: dict[str, Seat] = field(default_factory=dict)  # agents with live state
    joins: dict[str, int] = field(default_factory=dict)  # agent -> times it joined (its seed's salt)
    steps: int = 0  # act requests answered in this episode (by this process, under an external store)
    inflight: int = 0  # requests accepted but not answered; such an episode is never evicted
    ended: bool = False
    # The external store's bookkeeping (``redis_episodes``): whether the record there is
    # current, and when it was last written (its TTL refreshed).
    dirty: bool = False
    written: float = 0.0
    fresh: bool = False  # read from the external store for the request now being accepted

    def seat_for(self, agent_id: str, policy: str) -> tuple[Seat, bool]:
        """The agent's seat, and True if it joins now (a new seat: its session starts)."""
        seat = self.seats.get(agent_id)
        if seat is not None:
            return seat, False
        seat = Seat(policy, agent_session_id(self.id, agent_id))
        self.seats[agent_id] = seat
        self.joins[agent_id] = self.joins.get(agent_id, 0) + 1
        self.dirty = True
        return seat, True

    def leave(self, agent_id: str) -> Seat | None:
        seat = self.seats.pop(agent_id, None)
        if seat is not None:
            self.dirty = True
        return seat


def agent_session_id(episode_id: str, agent_id: str) -> str:
    """The session id of ``agent_id``'s state in ``episode_id``: readable when it fits a session
    id, else the episode id's start and a digest of both (ids stay unique either way)."""
    readable = f"{episode_id}#{agent_id}"
    if len(readable) <= MAX_SESSION_ID_LENGTH:
        return readable
    digest = hashlib.sha256(f"{episode_id}\x00{agent_id}".encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{episode_id[:MAX_SESSION_ID_LENGTH - 34]}#~{digest}"


class EpisodeStore:
    """The episodes of one policy set in this process."""

    durable = False  # nothing to write around a step (see ``redis_episodes``)

    def __init__(self, *, idle_ttl_s: float, max_episodes: int, tombstones: int = 100_000,
                 clock: Callable[[], float] = time.monotonic, refusal: str | None = None):
        self.idle_ttl_s = float(idle_ttl_s)
        self.max_episodes = int(max_episodes)
        self.clock = clock
        self.refusal = refusal  # why episodes cannot be created here (several workers, no shared store)
        self._episodes: OrderedDict[str, Episode] = OrderedDict()
        self._tombstones: OrderedDict[str, str] = OrderedDict()
        self._tombstone_cap = int(tombstones)

    def __len__(self) -> int:
        return len(self._episodes)

    def ids(self) -> list[str]:
        return list(self._episodes)

    # ------------------------------------------------------------------ lookups

    def live(self, episode_id: str) -> Episode | None:
        episode = self._episodes.get(episode_id)
        if episode is not None and (episode.inflight or self.clock() - episode.last_used <= self.idle_ttl_s):
            return episode
        return None

    def get(self, episode_id: str) -> Episode:
        """The live episode; 410 if it ended or expired, 404 if unknown."""
        episode = self.live(episode_id)
        if episode is not None:
            return episode
        if episode_id in self._episodes:
            self._drop(self._episodes[episode_id], "expired after being idle")
        reason = self._tombstones.get(episode_id)
        if reason is not None:
            raise SessionExpired(f"episode {episode_id!r} is gone ({reason}); start a new one",
                                 field="episode_id", received=episode_id)
        if self.refusal is not None:  # no episode can exist here: creating it was refused
            raise SessionsUnavailable(self.refusal, field="episode_id", received=episode_id)
        raise SessionNotFound(f"unknown episode {episode_id!r}: create it (POST .../episodes) or send "
                              "episode_start=true", field="episode_id", received=episode_id)

    def find(self, episode_id: str) -> Episode:
        """``get`` for the act path (an external store may raise ``SessionMiss`` here)."""
        return self.get(episode_id)

    async def lookup(self, episode_id: str) -> Episode:
        """``get`` for the routes (an external store reads the episode when it is not held here)."""
        return self.get(episode_id)

    def find_live(self, episode_id: str) -> Episode | None:
        """``live`` for the act path (an external store may raise ``SessionMiss`` here)."""
        return self.live(episode_id)

    # ------------------------------------------------------------------ lifecycle

    def create(self, episode_id: str | None, seed: int | None) -> Episode:
        if self.refusal is not None:
            raise SessionsUnavailable(self.refusal, field="episode_id", received=episode_id)
        episode_id = validate_episode_id(episode_id) if episode_id is not None else uuid.uuid4().hex
        if self.live(episode_id) is not None:
            raise SessionConflict(f"episode {episode_id!r} already exists; end it first or send episode_start=true",
                                  field="episode_id", received=episode_id)
        self.expire_idle()
        if len(self._episodes) >= self.max_episodes:
            self._evict_one()
        now = self.clock()
        episode = Episode(episode_id, seed, now, now, dirty=True)
        self.hold(episode)
        return episode

    def hold(self, episode: Episode) -> None:
        """Keep ``episode`` here (a new one, or one read from an external store)."""
        old = self._episodes.pop(episode.id, None)
        if old is not None:
            old.ended = True
        self._episodes[episode.id] = episode
        self._tombstones.pop(episode.id, None)

    def touch(self, episode: Episode) -> None:
        episode.last_used = self.clock()
        if not episode.ended and self._episodes.get(episode.id) is episode:
            self._episodes.move_to_end(episode.id)

    def end(self, episode: Episode, reason: str = "ended by the client") -> None:
        self._drop(episode, reason)

    def pin(self, episode: Episode) -> None:
        """A request of the episode was accepted: never evicted or expired until ``unpin``."""
        episode.inflight += 1

    def unpin(self, episode: Episode) -> None:
        """The request's batches are over: one more step of the episode, used now."""
        episode.inflight -= 1
        episode.steps += 1
        self.touch(episode)

    def in_flight(self, episode_id: str) -> bool:
        """Whether a request of the live episode ``episode_id`` is in flight here."""
        episode = self.live(episode_id)
        return episode is not None and episode.inflight > 0

    async def open(self, episode_id: str | None, seed: int | None) -> Episode:
        """``create`` for the routes (an external store refuses an id it holds)."""
        return self.create(episode_id, seed)

    def require_fresh(self, episode: Episode) -> None:
        """Before a step changes the episode's seats: this process holds the only copy."""

    def refresh(self, episode: Episode) -> None:
        """Keep an unchanged episode alive: here ``touch`` does."""

    def save(self, episode: Episode) -> Awaitable[None] | None:
        """Record the episode's changed seats: here they are recorded already."""
        episode.dirty = False
        return None

    def finish(self, episode: Episode) -> Awaitable[None] | None:
        """The episode's end (its agents' sessions were ended by the caller)."""
        self.end(episode)
        return None

    def forget(self, episode: Episode) -> None:
        """Let go of the copy held here without a tombstone (it lives on in an external store)."""
        if self._episodes.get(episode.id) is episode:
            self._drop(episode, "", tombstone=False)

    def expire_idle(self) -> int:
        deadline = self.clock() - self.idle_ttl_s
        stale = []
        for episode in self._episodes.values():
            if episode.last_used >= deadline:
                break
            if not episode.inflight:
                stale.append(episode)
        for episode in stale:
            self._drop(episode, "expired after being idle", tombstone=not self.durable)
        return len(stale)

    def clear(self, reason: str) -> None:
        for episode in list(self._episodes.values()):
            self._drop(episode, reason)

    def _evict_one(self) -> None:
        for episode in self._episodes.values():
            if not episode.inflight:
                self._drop(episode, "evicted: the server's episode limit was reached", tombstone=not self.durable)
                return
        raise QueueFull(f"all {self.max_episodes} episodes have requests in flight; retry later",
                        headers={"Retry-After": "1"})

    def _drop(self, episode: Episode, reason: str, tombstone: bool = True) -> None:
        if self._episodes.get(episode.id) is episode:
            del self._episodes[episode.id]
        episode.ended = True
        if tombstone and self._tombstone_cap:
            self._tombstones[episode.id] = reason
            self._tombstones.move_to_end(episode.id)
            while len(self._tombstones) > self._tombstone_cap:
                self._tombstones.popitem(last=False)


def validate_episode_id(episode_id: object) -> str:
    """An episode id is as long as a session id may be (1..128 characters)."""
    if not isinstance(episode_id, str) or not 0 < len(episode_id) <= MAX_SESSION_ID_LENGTH:
        raise BadRequest(f"episode_id must be a non-empty string of at most {MAX_SESSION_ID_LENGTH} characters",
                         field="episode_id", expected=f"string of 1..{MAX_SESSION_ID_LENGTH} characters",
                         received=episode_id)
    return episode_id


def validate_agent_id(agent_id: object, field: str) -> str:
    if not isinstance(agent_id, str) or not 0 < len(agent_id) <= MAX_AGENT_ID_LENGTH:
        raise BadRequest(f"{field}: an agent id must be a non-empty string of at most {MAX_AGENT_ID_LENGTH} "
                         "characters", field=field, expected=f"string of 1..{MAX_AGENT_ID_LENGTH} characters",
                         received=agent_id)
    return agent_id
