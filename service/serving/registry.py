"""Loaded models by name and version: lookups, registration and unloading.

Each model name has one *current* version (the last one loaded) that new sessions and
unpinned stateless requests use; older versions keep serving the sessions bound to them
until those end or the version is unloaded. Loading builds the whole policy (runtime,
reference check, session store, batcher; ``rlserve.service.serving.loading``) before it is
registered, so a failed load leaves whatever was serving untouched.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rlserve.service.errors import (
    BundleInvalid,
    InternalError,
    ModelNotFound,
    NotReady,
    ServiceError,
    SessionConflict,
    SessionExpired,
    SessionNotFound,
    VersionConflict,
)
from rlserve.service.experience.log import ExperienceLog
from rlserve.service.serving.checkpoints import parse_checkpoint_arg
from rlserve.service.serving.loading import discover_bundles, fingerprint, load_policy
from rlserve.service.serving.metrics import Metrics
from rlserve.service.serving.policy import Policy
from rlserve.service.sessions.base import SessionMiss, after_loading
from rlserve.service.sessions.record import RecordError, record_version
from rlserve.service.sessions.redis_store import ModelSessions, RedisSessions
from rlserve.service.sessions.store import MAX_SESSION_ID_LENGTH, Session
from rlserve.service.settings import Settings

log = logging.getLogger("rlserve.registry")

@dataclass
class ModelEntry:
    """All loaded versions of one model name; ``current`` serves new work."""

    name: str
    versions: OrderedDict[str, Policy] = field(default_factory=OrderedDict)
    current: str = ""
    # Sessions of unloaded versions, so their ids answer 410 rather than 404.
    gone: OrderedDict[str, str] = field(default_factory=OrderedDict)
    # The external store's keys of this model's sessions (None: sessions live in-process).
    remote: ModelSessions | None = None
    # Ids just read from the store and not found there (None) or not servable here (why),
    # so the lookup that follows the read answers instead of reading again: (when, what,
    # which read); that lookup settles them (``SessionMiss.settle``).
    checked: OrderedDict[str, tuple[float, ServiceError | None, object]] = field(default_factory=OrderedDict)

    def policy(self, version: str | None = None) -> Policy:
        key = self.current if version is None else version
        policy = self.versions.get(key)
        if policy is None:
            raise ModelNotFound(
                f"model {self.name!r} has no version {version!r}; loaded: {list(self.versions)}",
                field="version", expected=list(self.versions), received=version,
            )
        return policy

    def find_session(self, session_id: str) -> tuple[Policy, Session]:
        """The live session and its policy; 410 if it is gone, 404 if never seen."""
        for policy in self.versions.values():
            session = policy.sessions.live(session_id)
            if session is not None:
                return policy, session
        for policy in self.versions.values():
            if policy.sessions.knows(session_id):
                return policy, policy.sessions.get(session_id)
        if self.remote is not None:
            error = self._checked(session_id)  # raises SessionMiss if the store was not asked yet
            if error is not None:
                raise error
        if session_id in self.gone:
            raise SessionExpired(f"session {session_id!r} is gone ({self.gone[session_id]})",
                                 field="session_id", received=session_id)
        raise SessionNotFound(
            f"unknown session {session_id!r} for model {self.name!r}: create it (POST /v1/models/{self.name}/sessions) "
            "or send episode_start=true",
            field="session_id", received=session_id,
        )

    def is_live(self, session_id: str) -> bool:
        if any(session_id in p.sessions for p in self.versions.values()):
            return True
        if self.remote is not None:
            error = self._checked(session_id)
            # A session the store holds but this replica cannot serve is not free to create.
            if error is not None and not isinstance(error, SessionExpired):
                raise error
        return False

    # ------------------------------------------------------------------ the external store

    CHECKED_FOR_S = 1.0  # at most this long, should a lookup fail to settle its read

    def _checked(self, session_id: str) -> ServiceError | None:
        """What the last read said of an id not held here; SessionMiss when none is recent."""
        seen = self.checked.get(session_id)
        if seen is None or time.monotonic() - seen[0] > self.CHECKED_FOR_S:
            raise self._miss([session_id])
        return seen[1]

    def _miss(self, session_ids: list[str]) -> SessionMiss:
        read = object()
        return SessionMiss(session_ids, lambda: self.load_sessions(session_ids, read),
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

    def is_held(self, session_id: str) -> bool:
        return any(p.sessions.live(session_id) is not None or p.sessions.knows(session_id)
                   for p in self.versions.values())

    async def load_sessions(self, session_ids: list[str], read: object = None) -> None:
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
                    error = SessionExpired(f"session {session_id!r} is gone ({tomb}); start a new episode",
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
            return InternalError(f"session {session_id!r} in the store is unreadable: {exc}",
                                 field="session_id", received=session_id)
        policy = self.versions.get(version)
        if policy is None:
            return NotReady(f"session {session_id!r} is bound to version {version!r} of model {self.name!r}, "
                            f"which this replica has not loaded (loaded: {list(self.versions)}); retry later",
                            field="session_id", expected=version, received=list(self.versions),
                            headers={"Retry-After": "1"})
        try:
            policy.sessions.adopt(session_id, data)
        except RecordError as exc:
            return InternalError(f"session {session_id!r} in the store does not fit version {version!r}: {exc}",
                                 field="session_id", received=session_id)
        return None

    async def lookup(self, session_id: str) -> tuple[Policy, Session]:
        """``find_session`` for the routes: reads the store when the session is not held here."""
        try:
            return self.find_session(session_id)
        except SessionMiss as miss:
            return await after_loading(miss, lambda: self.find_session(session_id))

    def check_pinned(self, session_policy: Policy, version: str | None, session_id: str) -> None:
        if version is not None and session_policy.version != version:
            raise SessionConflict(
                f"session {session_id!r} is bound to version {session_policy.version!r}, not {version!r}",
                field="session_id", expected=session_policy.version, received=version,
            )


class ModelRegistry:
    def __init__(self, settings: Settings, metrics: Metrics | None = None, store: RedisSessions | None = None,
                 experience: ExperienceLog | None = None):
        self.settings = settings
        self.metrics = metrics
        self.store = store  # the external session store (None: sessions live in this process)
        self.experience = experience  # the experience log, attached to every version added
        self.entries: dict[str, ModelEntry] = {}
        self.failures: dict[str, str] = {}  # path in the repository -> why it did not load at start
        # Bundle paths of the repository tried, with their fingerprint then (serving/repository.py).
        self.seen: dict[str, float] = {}

    def load_policy(self, path: Path, *, shown: str | None = None, label: str | None = None,
                    name: str | None = None) -> Policy:
        """Build the policy of the bundle (or checkpoint) at ``path`` with this registry's
        settings, metrics and session store (blocking; not registered yet)."""
        return load_policy(path, self.settings, self.metrics, shown=shown, label=label, name=name, store=self.store)

    def entry(self, name: str) -> ModelEntry:
        entry = self.entries.get(name)
        if entry is None:
            raise ModelNotFound(f"no model named {name!r}; loaded: {sorted(self.entries)}",
                                field="model", expected=sorted(self.entries), received=name)
        return entry

    def policies(self) -> list[Policy]:
        return [p for e in self.entries.values() for p in e.versions.values()]

    def add(self, policy: Policy) -> None:
        """Register ``policy`` as its model's current version (409 if already loaded)."""
        entry = self.entries.get(policy.name)
        if entry is None:
            remote = None if self.store is None else self.store.for_model(policy.name)
            entry = self.entries[policy.name] = ModelEntry(policy.name, remote=remote)
        if policy.version in entry.versions:
            raise VersionConflict(
                f"model {policy.name!r} version {policy.version!r} is already loaded; unload it first",
                field="version", received=policy.version,
            )
        entry.versions[policy.version] = policy
        entry.current = policy.version
        if self.experience is not None:
            self.experience.attach(policy)
        log.info("serving %s (runtime %s)", policy.key, policy.runtime.describe())

    async def remove(self, name: str, version: str | None = None) -> list[str]:
        """Unload one version (or all); their sessions end with 410. Returns the versions."""
        entry = self.entry(name)
        versions = [version] if version is not None else list(entry.versions)
        for v in versions:
            entry.policy(v)  # 404 for an unknown version before anything changes
        for v in versions:
            policy = entry.versions.pop(v)
            for session_id in policy.sessions.ids():
                entry.gone[session_id] = f"model version {v!r} was unloaded"
            policy.sessions.clear()
            await policy.close()  # an uploaded archive's unpacked files go with it
            log.info("unloaded %s", policy.key)
        while len(entry.gone) > self.settings.session_tombstones:
            entry.gone.popitem(last=False)
        if not entry.versions:
            del self.entries[name]
        elif entry.current not in entry.versions:
            entry.current = next(reversed(entry.versions))
        return versions

    def load_repository(self, root: Path) -> None:
        """Load every bundle under ``root``; failures are logged and listed, not fatal."""
        loaded: list[tuple[str, Policy]] = []
        for path in discover_bundles(root):
            # Named relative to the repository: failures are listed on the public /readyz.
            shown = str(path.relative_to(root))
            self.seen[str(path)] = fingerprint(path)
            try:
                loaded.append((shown, self.load_policy(path, shown=shown)))
            except BundleInvalid as exc:
                self.failures[shown] = exc.message
                log.error("skipping %s: %s", path, exc.message)
        # The newest bundle of each name becomes current, whatever the directory order.
        for shown, policy in sorted(loaded, key=lambda pair: (pair[1].bundle.manifest.created_at, pair[1].version)):
            try:
                self.add(policy)
            except VersionConflict as exc:
                policy.bundle.close()  # its batcher never ran; an archive's unpacked files go
                self.failures[shown] = exc.message
                log.error("skipping %s: %s", shown, exc.message)

    def load_checkpoints(self, checkpoints: list[str]) -> None:
        """Export and serve RLlib checkpoints (``PATH`` or ``NAME=PATH``); failures are
        logged and listed like the repository's."""
        for spec in checkpoints:
            name, path = parse_checkpoint_arg(spec)
            try:
                self.add(self.load_policy(path, name=name))
            except (BundleInvalid, VersionConflict) as exc:
                self.failures[spec] = exc.message
                log.error("skipping checkpoint %s: %s", spec, exc.message)

    def session_counts(self):
        for policy in self.policies():
            yield policy.name, policy.version, len(policy.sessions)
