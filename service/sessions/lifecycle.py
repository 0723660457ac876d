"""A session's whole life for one model name: the one place that changes session state.

``SessionResolver`` (``resolver.py``) answers which sessions a request's ids name without
changing anything; ``SessionLifecycle`` adds every change, over the same per-version stores:

- ``bind``: a validated request's sessions created, restarts noted, every one pinned
  (``inflight``: never evicted or expired while the request queues); its ``Bound.release``:
  the request's batch is over, its sessions touched and unpinned (in the store that held
  them when they were bound, whatever was loaded since);
- ending on the act path: ``Bound.end`` (a protocol's ``sequence_end``) and ``end_id`` (a
  policy set's finishing agent); from the routes ``open`` (with the "already exists" check), ``close``, ``export``,
  ``import_record`` (refused while a request is in flight; the id forgotten in every other
  version first), ``layout`` and ``idle_s`` to describe a session;
- ``sweep_idle``: the background sweep of idle sessions, every version;
- ``prefetch``: under an external store, the ids a step will end are read before anything
  changes (``SessionMiss``), so ending them needs no wait.

Callers (the act use case, the session and episode routes, other wire protocols, the
multi-agent episode plan) call these; none of them touches ``inflight``, the external
store's keys or a version's store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlserve.service.errors import ServiceError, SessionBusy, SessionConflict, quoted
from rlserve.service.sessions import scoring
from rlserve.service.sessions.base import SessionMiss, SessionStore
from rlserve.service.sessions.record import SessionLayout, SessionRecord
from rlserve.service.sessions.resolver import Binding, SessionResolver
from rlserve.service.sessions.store import Session


@dataclass(slots=True)
class Bound:
    """A request's sessions once bound: per row the session (None: a stateless row), the
    live sessions it starts a new episode in, with their new seed (applied when its batch
    runs, after their earlier steps), and the version's store that holds them."""

    store: SessionStore
    sessions: list[Session | None]
    restarts: list[tuple[Session, int | None]] | None = None
    finish: scoring.Finish | None = None  # the live results' listener (None: not scored)

    def release(self) -> None:
        """The request's batch is over (or it never got queued): touch and unpin its sessions."""
        store = self.store
        for session in self.sessions:
            if session is not None:
                store.touch(session)
                store.release(session)

    def end(self) -> None:
        """End the request's sessions once its step was served (a protocol's ``sequence_end``);
        one ended meanwhile stays as it is."""
        for session in self.sessions:
            if session is not None and not session.ended:
                if self.finish is not None:
                    scoring.ended(session, self.finish)
                try:
                    self.store.end(session.id)
                except ServiceError:
                    pass


class SessionLifecycle(SessionResolver):
    """The sessions of one model name across its loaded versions, and every change to them."""

    # The live results' listener: finish(version, return, length) per finished episode
    # (``scoring``); None: episodes are not scored.
    on_episode: scoring.Finish | None = None

    # ------------------------------------------------------------------ the act path

    def bind(self, binding: Binding, version: str, starts: Sequence[bool], seeds: Sequence[int | None],
             single: bool, rewards: Sequence[float | None] = (), ends: Sequence[int] | None = None) -> Bound | None:
        """Apply a validated request to its sessions (``resolve``'s ``binding``; ``version``
        the one that serves it): create the new ones, note the restarts, pin every one, and
        score their episodes (``rewards`` and ``ends`` the rows'; ``scoring``).
        None when the request names no session."""
        existing, new = binding.existing, binding.new
        if not existing and not new:
            return None
        store = self.stores[version]
        finish = self.on_episode
        if single and existing and not starts[0]:  # the common session step
            session = existing[0][1]
            session.inflight += 1
            if finish is not None and session.scored:
                reward = rewards[0] if rewards else None
                scoring.step(session, reward if reward is None or reward == reward else None,
                             0 if ends is None else ends[0], finish)
            return Bound(store, [session], None, finish)
        bound = Bound(store, [None] * len(starts), None, finish)
        sessions = bound.sessions
        for row, session in existing:
            if starts[row]:  # the batch restarts it, once its earlier steps ran
                if bound.restarts is None:
                    bound.restarts = []
                bound.restarts.append((session, seeds[row]))
            sessions[row] = session
        for row, session_id in new:
            sessions[row] = store.create(session_id, seeds[row])
        for held in sessions:
            if held is not None:
                held.inflight += 1
        if finish is not None:
            scoring.rows(sessions, starts, rewards or [None] * len(starts), ends, finish)
        return bound

    def end_id(self, session_id: str) -> None:
        """End session ``session_id`` if it is still here (already gone, or not held here: nothing to do)."""
        try:
            session = self.find(session_id)  # on a loaded version's store, if found
        except (ServiceError, SessionMiss):
            return
        if not session.ended:
            if self.on_episode is not None:
                scoring.ended(session, self.on_episode)
            self.stores[session.version].end(session.id)

    def sweep_idle(self) -> int:
        """End the sessions idle past their time in every version (lookups also do, lazily)."""
        return sum(store.expire_idle() for store in list(self.stores.values()))

    def prefetch(self, session_ids: Sequence[str]) -> None:
        """Under an external store, raise one ``SessionMiss`` for the ids not held here (a
        step that will end them reads them before anything changes); in-process, nothing."""
        if self.remote is not None:
            self.require_held(session_ids)

    # ------------------------------------------------------------------ the routes

    async def open(self, session_id: str | None, version: str, seed: int | None) -> Session:
        """Create a session on ``version`` (409 if a live session has the id: ids are unique
        per model name across versions; an external store refuses a taken id itself)."""
        if session_id is not None and self.remote is None and self.is_live(session_id):
            raise SessionConflict(f"session {quoted(session_id)} already exists", field="session_id",
                                  received=session_id)
        session = await self.stores[version].open_session(session_id, seed)
        if self.on_episode is not None:
            scoring.start(session, self.on_episode)
            session.episode_length = 0  # created without a step: its first act counts it
            session.seen_steps = -1
        return session

    async def close(self, session: Session) -> None:
        """End a session from the routes (an external store ends it there too)."""
        if self.on_episode is not None:
            scoring.ended(session, self.on_episode)
        await self.stores[session.version].end_session(session)

    async def export(self, session: Session) -> bytes:
        """The session as bytes (under an external store, the store's latest record)."""
        return await self.stores[session.version].export_session(session)

    async def stored_record(self, session: Session) -> SessionRecord | None:
        """Under an external store, the store's record of ``session`` (another replica may
        have stepped it since this one read it); in-process, None: the session is the truth."""
        if self.remote is None:
            return None
        return self.layout(session.version).decode(await self.export(session))

    def layout(self, version: str) -> SessionLayout:
        return self.stores[version].layout

    def idle_s(self, session: Session) -> tuple[float, float]:
        """(seconds since the session was last used, the idle time after which it expires)."""
        store = self.stores[session.version]
        return max(0.0, store.clock() - session.last_used), store.idle_ttl_s

    def in_flight(self, session_id: str) -> bool:
        """Whether a version holds ``session_id`` with a request in flight (an import must
        not replace it: the batch would write into a slot given away)."""
        return any((held := store.live(session_id)) is not None and held.inflight > 0
                   for store in self.stores.values())

    def check_idle(self, session_id: str, field: str, what: str) -> None:
        """Refuse (``SessionBusy``) to replace a session a request is using."""
        if self.in_flight(session_id):
            raise SessionBusy(f"{what} has a request in flight; retry when it is answered", field=field,
                              received=session_id)

    async def import_record(self, session_id: str, version: str, record: SessionRecord) -> Session:
        """Make ``record`` session ``session_id`` on ``version``, replacing one of that id on
        any version (one id, one version). The caller checked ``in_flight`` first (all of a
        request's ids before any is written)."""
        keep = self.stores[version]
        for store in self.stores.values():
            held = store.live(session_id)
            if store is not keep and held is not None:
                store.forget(held)
        return await keep.import_session(session_id, record)
