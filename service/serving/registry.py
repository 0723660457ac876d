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

from rlserve.models.export.names import NAME_RULE, SERVED_NAME, name_problem
from rlserve.models.multiagent.mapping import AgentMapping
from rlserve.service.engine.live_results import LiveResults
from rlserve.service.engine.metrics import Metrics
from rlserve.service.errors import BundleInvalid, ModelNotFound, ServiceError, VersionConflict, quoted
from rlserve.service.experience.log import ExperienceLog
from rlserve.service.serving.checkpoints import parse_checkpoint_arg
from rlserve.service.serving.loading import discover_bundles, fingerprint, load_policy
from rlserve.service.serving.policy import Policy
from rlserve.service.serving.policy_sets import ServedPolicySet, load_served_set, parse_set_arg
from rlserve.service.serving.shadowing import ShadowControl
from rlserve.service.serving.traffic import Guard, Traffic, check_weights
from rlserve.service.sessions.lifecycle import SessionLifecycle
from rlserve.service.sessions.redis_client import RedisSessions
from rlserve.service.settings import Settings
from rlserve.service.shadow.shadow import Shadow

log = logging.getLogger("rlserve.registry")


@dataclass
class ModelEntry:
    """All loaded versions of one model name; ``current`` serves new work. Its sessions
    (across the versions) are resolved and changed by ``sessions`` alone."""

    name: str
    sessions: SessionLifecycle
    versions: OrderedDict[str, Policy] = field(default_factory=OrderedDict)
    current: str = ""
    traffic: Traffic = field(init=False)  # the split of new episodes between the versions

    def __post_init__(self) -> None:
        self.traffic = Traffic(self)

    def drawn(self, version: str | None, key: str | None) -> str | None:
        """The version a new episode (``key`` its id; None: a stateless request) is served
        by: ``version`` when the request names one, else the split's draw (None: current)."""
        return version if version is not None else self.traffic.draw(key)

    def policy(self, version: str | None = None) -> Policy:
        key = self.current if version is None else version
        policy = self.versions.get(key)
        if policy is None:
            raise ModelNotFound(
                f"model {self.name!r} has no version {quoted(version)}; loaded: {list(self.versions)}",
                field="version", expected=list(self.versions), received=version,
            )
        return policy


class ModelRegistry:
    def __init__(self, settings: Settings, metrics: Metrics | None = None, store: RedisSessions | None = None,
                 experience: ExperienceLog | None = None):
        self.settings = settings
        self.metrics = metrics
        self.store = store  # the external session store (None: sessions live in this process)
        self.experience = experience  # the experience log, attached to every version added
        self.entries: dict[str, ModelEntry] = {}
        # Policy sets by name (multi-agent); their members are ordinary entries ``<set>.<policy_id>``.
        self.sets: dict[str, ServedPolicySet] = {}
        self.failures: dict[str, str] = {}  # path in the repository -> why it did not load at start
        # Bundle paths of the repository tried, with their fingerprint then (serving/repository.py).
        self.seen: dict[str, float] = {}
        self.live = LiveResults()  # per-version requests, latency and finished episodes
        if metrics is not None:
            metrics.registry.register(self.live)
        guard = settings.canary_guard
        self.guard = None if guard is None else Guard(float(guard["margin"]), int(guard["min_episodes"]))
        self.shadows = ShadowControl(settings, experience)  # shadow candidates on live versions

    def load_policy(self, path: Path, *, shown: str | None = None, label: str | None = None,
                    name: str | None = None) -> Policy:
        """Build the policy of the bundle (or checkpoint) at ``path`` with this registry's
        settings, metrics and session store (blocking; not registered yet)."""
        return load_policy(path, self.settings, self.metrics, shown=shown, label=label, name=name, store=self.store)

    def entry(self, name: str) -> ModelEntry:
        entry = self.entries.get(name)
        if entry is None:
            if name in self.sets:
                members = sorted(self.sets[name].members.values())
                raise ModelNotFound(f"{quoted(name)} is a policy set (multi-agent): act with POST "
                                    f"/v1/models/{name}/agents/act, or address one of its policies as a model: "
                                    f"{members}",
                                    field="model", expected=sorted(self.entries), received=name)
            raise ModelNotFound(f"no model named {quoted(name)}; loaded: {sorted(self.entries)}",
                                field="model", expected=sorted(self.entries), received=name)
        return entry

    def policy_set(self, name: str) -> ServedPolicySet:
        served = self.sets.get(name)
        if served is None:
            raise ModelNotFound(f"no policy set named {quoted(name)}; loaded: {sorted(self.sets)}"
                                + (" (it is a single-policy model: use POST /v1/models/{name}/act)"
                                   if name in self.entries else ""),
                                field="model", expected=sorted(self.sets), received=name)
        return served

    def add_policy_set(self, served: ServedPolicySet) -> None:
        """Register a policy set and each of its members as a model (409 if a name is taken)."""
        taken = [n for n in (served.name, *served.members.values()) if n in self.entries or n in self.sets]
        if taken:
            raise VersionConflict(f"policy set {served.name!r}: the names {taken} are already served; unload them "
                                  "first", field="model", received=taken[0])
        for policy in served.policies.values():
            self.add(policy)
        self.sets[served.name] = served
        log.info("serving policy set %s with %s (mapping: %s)", served.name, served.members,
                 served.mapping.describe())

    def load_policy_sets(self, specs: list[str], mapping: AgentMapping | None = None) -> None:
        """Serve policy sets (``[NAME=]DIR``: a set directory, or a multi-policy RLlib checkpoint
        exported with ``mapping``); failures are logged and listed like the repository's."""
        for spec in specs:
            name, path = parse_set_arg(spec)
            try:
                self.add_policy_set(load_served_set(path, self.settings, self.metrics, name=name, mapping=mapping,
                                                    store=self.store))
            except (BundleInvalid, VersionConflict) as exc:
                self.failures[spec] = exc.message
                log.error("skipping policy set %s: %s", spec, exc.message)

    def policies(self) -> list[Policy]:
        return [p for e in self.entries.values() for p in e.versions.values()]

    def add(self, policy: Policy) -> None:
        """Register ``policy`` as its model's current version (409 if already loaded; 422
        if its name or version could not be addressed: every way in checks them earlier)."""
        for field_name, value in (("name", policy.name), ("version", policy.version)):
            problem = name_problem(value, SERVED_NAME)
            if problem is not None:
                raise BundleInvalid(f"a model's {field_name} must be {NAME_RULE}; this one's is {problem}",
                                    field=field_name, expected=NAME_RULE, received=value)
        entry = self.entries.get(policy.name)
        if entry is None:
            remote = None if self.store is None else self.store.for_model(policy.name)
            sessions = SessionLifecycle(policy.name, remote, tombstones=self.settings.session_tombstones)
            entry = self.entries[policy.name] = ModelEntry(policy.name, sessions)
            sessions.on_episode = self._scorer(entry)
        if policy.version in entry.versions:
            raise VersionConflict(
                f"model {policy.name!r} version {policy.version!r} is already loaded; unload it first",
                field="version", received=policy.version,
            )
        entry.versions[policy.version] = policy
        entry.sessions.add(policy.version, policy.sessions)
        entry.current = policy.version
        if self.experience is not None:
            self.experience.attach(policy)
        log.info("serving %s (runtime %s)", policy.key, policy.runtime.describe())
        self._configured_split(entry)

    def _scorer(self, entry: ModelEntry):
        """The entry's finished-episode listener: counted, then the guard looks."""
        live, name = self.live, entry.name

        def finish(version: str, episode_return: float, length: int) -> None:
            live.episode(name, version, episode_return, length)
            if entry.traffic.guard is not None:
                entry.traffic.check_guard(lambda v: live.of(name, v))

        return finish

    def _configured_split(self, entry: ModelEntry) -> None:
        """RLSERVE_CANARY's split of this model, once every version it names is loaded
        (and nothing changed the model's traffic before)."""
        weights = self.settings.canary.get(entry.name)
        if weights is None or entry.traffic.changes or any(v not in entry.versions for v in weights):
            return
        entry.traffic.set_weights(check_weights(weights, entry.versions, entry.name, "RLSERVE_CANARY"),
                                  "RLSERVE_CANARY")
        if self.guard is not None:
            entry.traffic.set_guard(self.guard, "RLSERVE_CANARY_GUARD")

    def unapplied_splits(self) -> list[str]:
        """The models RLSERVE_CANARY names whose versions are not all loaded."""
        return [name for name in self.settings.canary
                if name not in self.entries or not self.entries[name].traffic.changes]

    async def remove(self, name: str, version: str | None = None) -> list[str]:
        """Unload one version (or all); their sessions end with 410. Returns the versions."""
        entry = self.entry(name)
        versions = [version] if version is not None else list(entry.versions)
        for v in versions:
            entry.policy(v)  # 404 for an unknown version before anything changes
        for v in versions:
            policy = entry.versions.pop(v)
            entry.traffic.unloaded(v)  # its weight goes, the others renormalise
            entry.sessions.retire(v)  # its sessions end: their ids answer 410
            self.shadows.removed(policy)
            await policy.close()  # an uploaded archive's unpacked files go with it
            log.info("unloaded %s", policy.key)
        if not entry.versions:
            del self.entries[name]
        elif entry.current not in entry.versions:
            entry.current = next(reversed(entry.versions))
        return versions

    def start_shadow(self, name: str, version: str | None, candidate: str, candidate_version: str | None,
                     queue_rows: int) -> Shadow:
        """Shadow ``name`` (``version``, default its current one) with the loaded model
        ``candidate`` (``candidate_version``, default its current one); 404 naming the
        field for an unknown model or version."""
        live = self.entry(name).policy(version)
        try:
            other = self.entry(candidate).policy(candidate_version)
        except ModelNotFound as exc:
            exc.field = f"candidate.{exc.field}"
            raise
        return self.shadows.start(live, other, queue_rows)

    def start_shadows(self, shadows: dict[str, dict]) -> None:
        """The shadows of ``RLSERVE_SHADOW``, once the models are loaded; one that cannot
        start (an unknown model or version, other spaces) is logged and listed with the
        bundles that failed to load (``/readyz``), and the others run."""
        for name, spec in shadows.items():
            candidate, _, version = spec["candidate"].partition("@")
            try:
                self.start_shadow(name, spec.get("version"), candidate, version or None, spec.get("queue_rows", 4096))
            except ServiceError as exc:
                self.failures[f"RLSERVE_SHADOW[{name}]"] = exc.message
                log.error("shadow of %s not started: %s", name, exc.message)

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
            except (VersionConflict, BundleInvalid) as exc:
                policy.bundle.close()  # its batcher never ran; an archive's unpacked files go
                if isinstance(exc, VersionConflict) and self._is_loaded(policy):
                    # The same bundle twice (`rlserve export --archive` writes DIR and DIR.rlsb
                    # side by side): served once, nothing failed.
                    log.info("%s is the same bundle as the loaded %s; served once", shown, policy.key)
                    continue
                self.failures[shown] = exc.message
                log.error("skipping %s: %s", shown, exc.message)

    def _is_loaded(self, policy: Policy) -> bool:
        """Whether the very same bundle (equal manifest, so equal files) serves ``policy.key``."""
        entry = self.entries.get(policy.name)
        loaded = None if entry is None else entry.versions.get(policy.version)
        digest = policy.bundle.manifest.data.get("manifest_sha256")
        return (loaded is not None and digest is not None
                and loaded.bundle.manifest.data.get("manifest_sha256") == digest)

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

    def queued_rows(self):
        for policy in self.policies():
            yield policy.name, policy.version, policy.batcher.queued_rows if policy.batcher else 0
