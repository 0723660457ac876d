"""What one act request of a policy set does to its episode, planned before anything changes.

``plan_episode`` finds the request's episode (or notes that it starts one); the use case
asks the plan, per agent, which policy already holds its state (``policy_of``) and which
session row the agent sends (``seat``: its session id, whether its state starts now, its
seed); agents sent with ``done`` are noted (``finish``). Only once every part of the request
validated does ``bind`` apply it all: the episode created or restarted, joining agents
seated, finished agents' sessions ended. ``settle`` runs when the request's batches are
over: the episode's end ends every agent's state, and an external store is given the
changed record.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable
from dataclasses import dataclass, field

from rlserve.service.errors import ServiceError
from rlserve.service.multiagent.wire import AgentsActRequest
from rlserve.service.serving.policy_sets import ServedPolicySet
from rlserve.service.serving.registry import ModelRegistry
from rlserve.service.sessions.base import SessionMiss
from rlserve.service.sessions.episode_store import Episode, Seat, agent_session_id, validate_episode_id

_SEED_MASK = (1 << 64) - 1


def derive_seed(seed: int | None, agent_id: str, joins: int) -> int | None:
    """An agent's sampler seed, from the episode's seed, the agent id and how often it joined
    (the same in every process and replica)."""
    if seed is None:
        return None
    digest = hashlib.sha256(f"{seed}\x00{agent_id}\x00{joins}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") & _SEED_MASK


@dataclass
class EpisodePlan:
    served: ServedPolicySet
    id: str | None  # None: a stateless request (every agent acts from the initial state)
    episode: Episode | None  # the live episode (None: it starts with this request, or stateless)
    restart: bool = False  # episode_start on a live episode
    seed: int | None = None
    joins: dict[str, tuple[str, str]] = field(default_factory=dict)  # agent -> (policy, session id)
    finishing: list[str] = field(default_factory=list)
    closing: list[str] = field(default_factory=list)  # done with a last observation: end after the step
    ended: bool = False

    @property
    def stateful(self) -> bool:
        return self.id is not None

    def _seated(self, agent_id: str) -> Seat | None:
        if self.episode is None or self.restart:
            return None
        return self.episode.seats.get(agent_id)

    def policy_of(self, agent_id: str) -> str | None:
        """The policy already holding the agent's state (kept, whatever the mapping says now)."""
        seat = self._seated(agent_id)
        return None if seat is None else seat.policy

    def seat(self, agent_id: str, policy_id: str) -> tuple[str | None, bool, int | None]:
        """The agent's row: (session id, starts now, seed of a starting session)."""
        if self.id is None:
            return None, False, None
        seat = self._seated(agent_id)
        if seat is not None:
            return seat.session_id, False, None
        session_id = agent_session_id(self.id, agent_id)
        self.joins[agent_id] = (policy_id, session_id)
        return session_id, True, derive_seed(self.seed, agent_id, self._joined(agent_id) + 1)

    def member_version(self, policy_id: str, registry: ModelRegistry) -> str | None:
        """The version this episode's live agents of ``policy_id`` are on (None: none is
        live here), so that an agent joining later joins its member's draw (``traffic``)."""
        if self.episode is None or self.restart:
            return None
        entry = registry.entries.get(self.served.member(policy_id))
        if entry is None:
            return None
        for seat in self.episode.seats.values():
            if seat.policy == policy_id:
                try:
                    return entry.sessions.find(seat.session_id).version
                except (ServiceError, SessionMiss):
                    continue
        return None

    def _joined(self, agent_id: str) -> int:
        if self.episode is None or (self.restart and self.seed != self.episode.seed):
            return 0
        return self.episode.joins.get(agent_id, 0)

    def finish(self, agent_id: str) -> None:
        if self._seated(agent_id) is not None:
            self.finishing.append(agent_id)

    def close_after(self, agent_id: str) -> None:
        """The agent sends its last observation: its state ends once this step is answered."""
        if self.id is not None:
            self.closing.append(agent_id)

    def check_finishing(self, registry: ModelRegistry) -> None:
        """Under an external store, a step that changes the seats first reads the episode
        again, and the sessions of finishing agents are read before anything changes
        (``SessionMiss`` for each), so that ending them below needs no wait."""
        if self.episode is not None and (self.joins or self.finishing or self.closing or self.restart):
            self.served.episodes.require_fresh(self.episode)
        for agent_id in self.finishing:
            seat = self._seated(agent_id)
            assert seat is not None
            entry = registry.entries.get(self.served.member(seat.policy))
            if entry is not None:
                entry.sessions.prefetch([seat.session_id])

    # ------------------------------------------------------------------ apply

    def bind(self, registry: ModelRegistry) -> None:
        """Apply the plan (every part of the request validated)."""
        if self.id is None:
            return
        store = self.served.episodes
        if self.episode is None:
            self.episode = store.create(self.id, self.seed)
        elif self.restart:
            for agent_id, seat in list(self.episode.seats.items()):
                if agent_id not in self.joins:  # an agent that rejoins keeps its session, restarted
                    end_agent_session(registry, self.served, seat)
            self.episode.seats.clear()
            if self.seed != self.episode.seed:
                self.episode.seed, self.episode.joins = self.seed, {}
            self.episode.dirty = True
        self.episode.fresh = False
        for agent_id, (policy_id, _) in self.joins.items():
            self.episode.seat_for(agent_id, policy_id)
        for agent_id in self.finishing:
            left = self.episode.leave(agent_id)
            if left is not None:
                end_agent_session(registry, self.served, left)
        store.pin(self.episode)

    def settle(self, registry: ModelRegistry, ended: bool, answered: bool = True) -> Awaitable[None] | None:
        """The request's batches are over: unpin the episode; once ``answered``, end the state
        of the agents that sent their last observation; at its end, every agent's. Returns the
        external store's write of the changed record, if there is one."""
        episode = self.episode
        if episode is None:
            return None
        store = self.served.episodes
        store.unpin(episode)
        for agent_id in self.closing if answered else ():
            left = episode.leave(agent_id)
            if left is not None:
                end_agent_session(registry, self.served, left)
        if ended:
            for seat in episode.seats.values():
                end_agent_session(registry, self.served, seat)
            episode.seats.clear()
            self.ended = True
            return store.finish(episode)
        if episode.dirty:
            return store.save(episode)
        store.refresh(episode)
        return None


def plan_episode(served: ServedPolicySet, req: AgentsActRequest) -> EpisodePlan:
    """The request's episode, found (404/410, or ``SessionMiss`` under an external store)
    or noted as starting; nothing changes."""
    if req.episode_id is None:
        return EpisodePlan(served, None, None)
    episode_id = validate_episode_id(req.episode_id)
    store = served.episodes
    if req.episode_start:
        episode = store.find_live(episode_id)
        seed = None if req.seed is None else int(req.seed)
        if episode is not None and seed is None:
            seed = episode.seed  # a restart without a seed keeps the episode's (its agents' seeds move on)
        return EpisodePlan(served, episode_id, episode, restart=episode is not None, seed=seed)
    episode = store.find(episode_id)
    return EpisodePlan(served, episode_id, episode, seed=episode.seed)


def end_agent_session(registry: ModelRegistry, served: ServedPolicySet, seat: Seat) -> None:
    """End an agent's session in its policy's store, if it is still there."""
    entry = registry.entries.get(served.member(seat.policy))
    if entry is not None:
        entry.sessions.end_id(seat.session_id)
