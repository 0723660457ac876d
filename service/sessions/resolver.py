"""Which session a request's id names: the one owner of session resolution for a model name.

A model name has loaded versions, each with its own session store; session ids are unique
per model name across them. ``SessionResolver`` answers, for one name, everything a
request or a route asks about its session ids before it runs:

- ``resolve``: one act request's ids at once (which live sessions it steps, which it
  creates, which version they bind it to), the pin check against a requested version,
  the refusals naming the request's field;
- ``find`` / ``lookup`` / ``is_live`` / ``target_version``: one id, for the routes and
  other wire formats;
- under an external store: ids not held here raise ``SessionMiss`` (one read for all the
  request's ids, ``load``), and what the read found is adopted into the cache of the
  version each record is bound to, or remembered for the lookup that follows the read;
- the ids of unloaded versions, remembered so they answer 410 rather than 404.

The registry (``rlserve.service.serving.registry``) only hands out models: it adds a
version's store here when the version loads and retires it when it unloads.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from rlserve.service.errors import (
    BadRequest,
    InternalError,
    NotReady,
    ServiceError,
    SessionConflict,
    SessionExpired,
    SessionNotFound,
    SessionsUnavailable,
    quoted,
)
from rlserve.service.sessions.base import SessionMiss, SessionStore, after_loading
from rlserve.service.sessions.record import RecordError, record_version
from rlserve.service.sessions.redis_client import ModelSessions
from rlserve.service.sessions.store import MAX_SESSION_ID_LENGTH, Session, validate_session_id


@dataclass(slots=True)
class Binding:
    """What a request does to sessions once it validated: the live sessions it steps and
    the ids it creates, by row, and the version its live sessions are bound to (None: none
    is live, the request's own version applies)."""

    existing: list[tuple[int, Session]] = field(default_factory=list)  # (row, live session)
    new: list[tuple[int, str]] = field(default_factory=list)  # (row, id to create)
    version: str | None = None


class SessionResolver:
    """The sessions of one model name across its loaded versions."""

    CHECKED_FOR_S = 1.0  # at most this long, should a lookup fail to settle its read

    def __init__(self, model: str, remote: ModelSessions | None = None, tombstones: int = 100_000):
        self.model = model
        # The external store's keys of this model's sessions (None: sessions live in-process).
        self.remote = remote
        self.tombstones = tombstones
        self.stores: dict[str, SessionStore] = {}  # version -> its store, in load order
        # Sessions of unloaded versions, so their ids answer 410 rather than 404.
        self.gone: OrderedDict[str, str] = OrderedDict()
        # Ids just read from the store and not found there (None) or not servable here (why),
        # so the lookup that follows the read answers instead of reading again: (when, what,
        # which read); that lookup settles them (``SessionMiss.settle``).
        self.checked: OrderedDict[str, tuple[float, ServiceError | None, object]] = OrderedDict()

    # ------------------------------------------------------------------ versions

    def add(self, version: str, store: SessionStore) -> None:
        self.stores[version] = store

    def retire(self, version: str) -> SessionStore:
        """A version unloads: its sessions end (their ids answer 410 from now on)."""
        store = self.stores.pop(version)
        for session_id in store.ids():
            self.gone[session_id] = f"model version {version!r} was unloaded"
        store.clear()
        while len(self.gone) > self.tombstones:
            self.gone.popitem(last=False)
        return store

    # ------------------------------------------------------------------ one request

    def resolve(self, session_ids: Sequence[str | None], episode_starts: Sequence[bool], version: str | None,
                single: bool) -> Binding:
        """The sessions one act request touches (no mutation): each id is validated, found
        (or marked for creation where its row starts an episode and the id is free), checked
        against ``version`` (a pinned request) and against the others' version. Errors name
        the request's field (``session_id``, or ``session_ids[row]`` in the batch form)."""
        if single and not episode_starts[0]:
            # The common session step: one live session, no creation.
            session = self.find(validate_session_id(session_ids[0]))
            self.check_pinned(session, version)
            return Binding([(0, session)], [], session.version)
        if self.remote is not None:  # all the request's sessions read from the store at once
            self.require_held(session_ids)
        binding = Binding()
        seen: set[str] = set()
        for row, session_id in enumerate(session_ids):
            if session_id is None:
                continue
            name = "session_id" if single else f"session_ids[{row}]"
            try:
                validate_session_id(session_id)
                if session_id in seen:
                    raise BadRequest(f"{name}: session {quoted(session_id)} appears twice in one request",
                                     field=name, expected="each session at most once per request",
                                     received=session_id)
                seen.add(session_id)
                if episode_starts[row] and not self.is_live(session_id):
                    binding.new.append((row, session_id))
                    continue
                session = self.find(session_id)
                self.check_pinned(session, version)
            except ServiceError as exc:
                if exc.field == "session_id" and not single:  # the helpers name the single form
                    exc.field, exc.message = name, f"{name}: {exc.message}"
                raise
            if binding.version is not None and session.version != binding.version:
                raise SessionConflict(
                    f"{name}: sessions of one request must share a model version; {quoted(session_id)} is on "
                    f"{session.version!r}, others on {binding.version!r}",
                    field=name, expected=binding.version, received=session.version)
            binding.version = session.version
            binding.existing.append((row, session))
        return binding

    @staticmethod
    def check_pinned(session: Session, version: str | None) -> None:
        if version is not None and session.version != version:
            raise SessionConflict(
                f"session {session.id!r} is bound to version {session.version!r}, not {quoted(version)}",
                field="session_id", expected=session.version, received=version,
            )

    # ------------------------------------------------------------------ one id

    def find(self, session_id: str) -> Session:
        """The live session (its ``version`` names its store); 410 if it is gone, 404 if
        never seen; ``SessionMiss`` if the external store was not asked yet."""
        for store in self.stores.values():
            session = store.live(session_id)
            if session is not None:
                return session
        for store in self.stores.values():
            if store.knows(session_id):
                return store.get(session_id)
        if self.remote is not None:
            error = self._checked(session_id)  # raises SessionMiss if the store was not asked yet
            if error is not None:
                raise error
        if session_id in self.gone:
            raise SessionExpired(f"session {quoted(session_id)} is gone ({self.gone[session_id]})",
                                 field="session_id", received=session_id)
        refusal = next((store.refusal for store in self.stores.values() if store.refusal is not None), None)
        if refusal is not None:  # no session can exist here: the id is not unknown, creating it was refused
            raise SessionsUnavailable(refusal, field="session_id", received=session_id)
        raise SessionNotFound(
            f"unknown session {quoted(session_id)} for model {self.model!r}: create it "
            f"(POST /v1/models/{self.model}/sessions) or send episode_start=true",
            field="session_id", received=session_id,
        )

    async def lookup(self, session_id: str) -> Session:
        """``find`` for the routes: reads the store when the session is not held here."""
        try:
            return self.find(session_id)
        except SessionMiss as miss:
            return await after_loading(miss, lambda: self.find(session_id))

    def is_live(self, session_id: str) -> bool:
        if any(session_id in store for store in self.stores.values()):
            return True
        # An id this replica remembers as gone (it ended here) is free, as ``find`` and
        # ``require_held`` take it: the store is not asked (``load`` skips held ids).
        if self.remote is not None and not self.is_held(session_id):
            error = self._checked(session_id)
            # A session the store holds but this replica cannot serve is not free to create.
            if error is not None and not isinstance(error, SessionExpired):
                raise error
        return False

    def target_version(self, session_id: str | None, start: bool) -> str | None:
        """The version a request's one session binds it to: its live session's (None: the
        id is free, or none was given; a new session takes the requested version)."""
        if session_id is not None and (not start or self.is_live(session_id)):
            return self.find(session_id).version
        return None

    def is_held(self, session_id: str) -> bool:
        return any(store.live(session_id) is not None or store.knows(session_id) for store in self.stores.values())

    # ------------------------------------------------------------------ the external store

    def _checked(self, session_id: str) -> ServiceError | None:
        """What the last read said of an id not held here; SessionMiss when none is recent."""
        seen = self.checked.get(session_id)
        if seen is None or time.monotonic() - seen[0] > self.CHECKED_FOR_S:
            raise self._miss([session_id])
        return seen[1]

    def _miss(self, session_ids: list[str]) -> SessionMiss:
        read = object()
        return SessionMiss(session_ids, lambda: self.load(session_ids, read),
                           lambda: self._settle(session_ids, read))

    def _settle(self, session_ids: list[str], read: object) -> None:
        for session_id in session_ids:
            seen = self.checked.get(session_id)
            if seen is not None and seen[2] is read:
                del self.checked[session_id]

    def require_held(self, session_ids: Sequence[object]) -> None:
        """Raise one SessionMiss for every id of a request neither held here nor just read."""
        missing = []
        for session_id in session_ids:
            if (isinstance(session_id, str) and 0 < len(session_id) <= MAX_SESSION_ID_LENGTH
                    and not self.is_held(session_id)):
                seen = self.checked.get(session_id)
                if seen is None or time.monotonic() - seen[0] > self.CHECKED_FOR_S:
                    missing.append(session_id)
        if missing:
            raise self._miss(missing)

    async def load(self, session_ids: list[str], read: object = None) -> None:
        """Read ``session_ids`` from the store (one round trip) into the cache of the
        version each is bound to; remember the ones it does not have."""
        assert self.remote is not None
        found = await self.remote.fetch(session_ids)
        now = time.monotonic()
        misses = 0
        for session_id, (data, tomb) in zip(session_ids, found, strict=True):
            if self.is_held(session_id):
                continue  # read meanwhile by another request
            error: ServiceError | None = None
            if data is None:
                if tomb is not None:
                    error = SessionExpired(f"session {quoted(session_id)} is gone ({tomb}); start a new episode",
                                           field="session_id", received=session_id)
            else:
                misses += 1
                error = self._adopt(session_id, data)
            self.checked[session_id] = (now, error, read)
            self.checked.move_to_end(session_id)
        while self.checked and now - next(iter(self.checked.values()))[0] > self.CHECKED_FOR_S:
            self.checked.popitem(last=False)
        observer = self.remote.store.observer
        if misses and observer is not None:
            observer.session_cache(0, misses)

    def _adopt(self, session_id: str, data: bytes) -> ServiceError | None:
        try:
            version = record_version(data)
        except RecordError as exc:
            return InternalError(f"session {quoted(session_id)} in the store is unreadable: {exc}",
                                 field="session_id", received=session_id)
        store = self.stores.get(version)
        if store is None:
            return NotReady(f"session {quoted(session_id)} is bound to version {quoted(version)} of model "
                            f"{self.model!r}, "
                            f"which this replica has not loaded (loaded: {list(self.stores)}); retry later",
                            field="session_id", expected=version, received=list(self.stores),
                            headers={"Retry-After": "1"})
        try:
            store.adopt(session_id, data)
        except RecordError as exc:
            return InternalError(f"session {quoted(session_id)} in the store does not fit version "
                                 f"{quoted(version)}: {exc}",
                                 field="session_id", received=session_id)
        return None
