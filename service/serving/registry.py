"""Loaded models by name and version: lookups, registration and unloading.

Each model name has one *current* version (the last one loaded) that new sessions and
unpinned stateless requests use; older versions keep serving the sessions bound to them
until those end or the version is unloaded. Loading builds the whole policy (runtime,
reference check, session store, batcher; ``rlserve.service.serving.loading``) before it is
registered, so a failed load leaves whatever was serving untouched.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from rlserve.service.errors import (
    BundleInvalid,
    ModelNotFound,
    SessionConflict,
    SessionExpired,
    SessionNotFound,
    VersionConflict,
)
from rlserve.service.serving.checkpoints import parse_checkpoint_arg
from rlserve.service.serving.loading import discover_bundles, load_policy
from rlserve.service.serving.metrics import Metrics
from rlserve.service.serving.policy import Policy
from rlserve.service.sessions.store import Session
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
        if session_id in self.gone:
            raise SessionExpired(f"session {session_id!r} is gone ({self.gone[session_id]})",
                                 field="session_id", received=session_id)
        raise SessionNotFound(
            f"unknown session {session_id!r} for model {self.name!r}: create it (POST /v1/models/{self.name}/sessions) "
            "or send episode_start=true",
            field="session_id", received=session_id,
        )

    def is_live(self, session_id: str) -> bool:
        return any(session_id in p.sessions for p in self.versions.values())

    def check_pinned(self, session_policy: Policy, version: str | None, session_id: str) -> None:
        if version is not None and session_policy.version != version:
            raise SessionConflict(
                f"session {session_id!r} is bound to version {session_policy.version!r}, not {version!r}",
                field="session_id", expected=session_policy.version, received=version,
            )


class ModelRegistry:
    def __init__(self, settings: Settings, metrics: Metrics | None = None):
        self.settings = settings
        self.metrics = metrics
        self.entries: dict[str, ModelEntry] = {}
        self.failures: dict[str, str] = {}  # path in the repository -> why it did not load at start

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
        entry = self.entries.setdefault(policy.name, ModelEntry(policy.name))
        if policy.version in entry.versions:
            raise VersionConflict(
                f"model {policy.name!r} version {policy.version!r} is already loaded; unload it first",
                field="version", received=policy.version,
            )
        entry.versions[policy.version] = policy
        entry.current = policy.version
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
            try:
                loaded.append((shown, load_policy(path, self.settings, self.metrics, shown=shown)))
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
                self.add(load_policy(path, self.settings, self.metrics, name=name))
            except (BundleInvalid, VersionConflict) as exc:
                self.failures[spec] = exc.message
                log.error("skipping checkpoint %s: %s", spec, exc.message)

    def session_counts(self):
        for policy in self.policies():
            yield policy.name, policy.version, len(policy.sessions)
