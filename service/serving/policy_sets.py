"""How a policy set becomes served: each member a ``Policy`` of its own, plus the mapping.

A policy set (``rlserve.models.multiagent.policy_set``) is served as a thin layer above
single policies: every member bundle is built exactly as a bundle of its own
(``build_policy``: runtime, reference check, session store, batcher) and registered as the
model ``<set>.<policy_id>``, so its act, session and Open Inference Protocol routes work
as for any model; the set adds the agent mapping and the episodes (a record of per-agent
sessions in those members' stores, ``rlserve.service.sessions.episode_store``).
"""

from __future__ import annotations

import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlserve.models.checkpoint import CheckpointError
from rlserve.models.export.errors import BundleError
from rlserve.models.export.names import NAME_RULE, name_problem
from rlserve.models.multiagent.mapping import AgentMapping, MappingError
from rlserve.models.multiagent.policy_set import PolicySet, is_policy_set, load_policy_set, member_name
from rlserve.service.engine.metrics import Metrics
from rlserve.service.errors import BundleInvalid
from rlserve.service.serving.checkpoints import is_checkpoint
from rlserve.service.serving.loading import build_policy
from rlserve.service.serving.policy import Policy
from rlserve.service.sessions.episode_store import EpisodeStore
from rlserve.service.sessions.redis_client import RedisSessions
from rlserve.service.sessions.redis_episodes import CachedEpisodeStore
from rlserve.service.settings import Settings


@dataclass(eq=False)
class ServedPolicySet:
    """A policy set as served: its members' model names, the mapping, the episodes."""

    name: str
    version: str
    mapping: AgentMapping
    members: dict[str, str]  # policy id -> the member's model name
    episodes: EpisodeStore
    source: PolicySet
    policies: dict[str, Policy] = field(default_factory=dict)  # built, registered by the registry

    def member(self, policy_id: str) -> str:
        return self.members[policy_id]

    def metadata(self) -> dict[str, Any]:
        """What ``GET /v1/models/{name}`` shows of a policy set."""
        return {
            "name": self.name, "version": self.version, "kind": "policy_set",
            "created_at": self.source.data["created_at"],
            "mapping": self.mapping.to_json(), "mapping_rules": self.mapping.describe(),
            "policies": {pid: {"model": model, "version": self.policies[pid].version,
                               "observation_space": self.policies[pid].bundle.manifest.data["observation_space"],
                               "action_space": self.policies[pid].bundle.manifest.data["action_space"],
                               "recurrent": bool(self.policies[pid].bundle.manifest.signature.state)}
                         for pid, model in self.members.items()},
            "episodes": {"active": len(self.episodes), "max": self.episodes.max_episodes,
                         "idle_ttl_s": self.episodes.idle_ttl_s},
        }

    async def close(self) -> None:
        self.episodes.clear("its policy set was unloaded")
        for policy in self.policies.values():
            await policy.close()
        self.source.close()


def parse_set_arg(value: str) -> tuple[str | None, Path]:
    """``NAME=DIR`` or ``DIR`` (the set's own name, or the directory's for a checkpoint)."""
    name, sep, path = value.partition("=")
    if sep and name and "/" not in name:
        return name, Path(path)
    return None, Path(value)


def load_served_set(path: Path, settings: Settings, metrics: Metrics | None = None, *, name: str | None = None,
                    mapping: AgentMapping | None = None, store: RedisSessions | None = None,
                    episodes: EpisodeStore | None = None) -> ServedPolicySet:
    """Load the policy set at ``path`` (or export the multi-policy RLlib checkpoint there,
    with ``mapping``) and build every member. ``mapping`` replaces the set's own when given.
    Blocking; raises ``BundleInvalid`` naming what is wrong."""
    if name is not None:
        _check_set_name(path, name)  # before a checkpoint's export writes a directory of that name
    source = _read_set(path, name, mapping, settings.max_unpacked_bytes)
    try:
        set_name = _check_set_name(path, name or source.name)
        rules = mapping or source.mapping
        members = {pid: member_name(set_name, pid) for pid in source.policy_ids}
        store_of_episodes = episodes or _episode_store(settings, set_name, store)
        served = ServedPolicySet(set_name, source.version, rules, members, store_of_episodes, source)
        for policy_id, bundle in source.bundles.items():
            # Served under the set's name whatever the member bundle was called when exported.
            bundle.manifest.data["name"] = members[policy_id]
            served.policies[policy_id] = build_policy(bundle, settings, metrics, shown=f"{path.name}/{policy_id}",
                                                      store=store)
        return served
    except BaseException:
        source.close()
        raise


def _check_set_name(path: Path, set_name: str) -> str:
    """``set_name`` if a model name may start with it (its members are ``<set>.<policy_id>``)."""
    problem = name_problem(set_name)
    if problem is not None:
        raise BundleInvalid(f"cannot serve the policy set {path.name!r}: its name is {problem}; a set's name "
                            f"must be {NAME_RULE}", field="name", expected=NAME_RULE, received=set_name)
    return set_name


def _read_set(path: Path, name: str | None, mapping: AgentMapping | None, max_unpacked_bytes: int) -> PolicySet:
    if is_checkpoint(path):
        return _export_checkpoint_set(path, name, mapping)
    if not is_policy_set(path):
        raise BundleInvalid(f"cannot load the policy set {path.name!r}: no policy_set.json there (write one with "
                            "`rlserve export ... --mapping FILE`)", field="policy_set", received=path.name)
    try:
        return load_policy_set(path, max_unpacked_bytes=max_unpacked_bytes)
    except (BundleError, OSError) as exc:
        raise BundleInvalid(f"cannot load the policy set {path.name!r}: {exc}", field="policy_set",
                            received=path.name) from exc


def _export_checkpoint_set(path: Path, name: str | None, mapping: AgentMapping | None) -> PolicySet:
    if mapping is None:
        raise BundleInvalid(f"the multi-policy checkpoint {path.name!r} needs an agent mapping to be served as a "
                            "policy set: --mapping FILE, --map AGENT=POLICY or --default-policy ID",
                            field="mapping", received=None)
    try:  # every module that needs torch
        from rlserve.models.export.from_rlmodule import RLModuleExportError
        from rlserve.models.export.policy_set_export import export_policy_set
        from rlserve.models.rllib_import import WeightImportError
        from rlserve.models.rlmodules.catalog import RLModuleWeightError
    except ImportError as exc:
        raise BundleInvalid(f"serving an RLlib checkpoint needs torch to export it ({exc.name} is not installed)",
                            field="checkpoint", received=path.name) from None

    tmp = tempfile.TemporaryDirectory(prefix="rlserve-policy-set-")
    try:
        out = Path(tmp.name) / (name or path.resolve().name)
        policy_set = export_policy_set(path, out, mapping, name=name or path.resolve().name, formats=("onnx",))
    except (CheckpointError, WeightImportError, RLModuleExportError, RLModuleWeightError, BundleError, MappingError,
            OSError) as exc:
        tmp.cleanup()
        raise BundleInvalid(f"cannot serve the RLlib checkpoint {path.name!r} as a policy set: {exc}",
                            field="checkpoint", received=path.name) from exc
    except BaseException:
        tmp.cleanup()
        raise
    shared = _LastOneOut(tmp, len(policy_set.bundles))
    for bundle in policy_set.bundles.values():
        bundle._tmp = shared  # the export lives as long as its bundles, and goes with the last one closed
    return policy_set


class _LastOneOut:
    """The folder a checkpoint's policy set was exported into, shared by its member bundles:
    ``Bundle.close()`` calls ``cleanup()`` once per member, and the last call deletes it. (A
    server stopped by SIGTERM exits by the signal once uvicorn has shut down, so the folder's
    own finalizer never ran: every stop left one in the temporary directory.)"""

    def __init__(self, tmp: tempfile.TemporaryDirectory, members: int):
        self._tmp, self._left, self._lock = tmp, members, threading.Lock()

    def cleanup(self) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._tmp.cleanup()


def _episode_store(settings: Settings, set_name: str, store: RedisSessions | None) -> EpisodeStore:
    common: dict[str, Any] = dict(idle_ttl_s=settings.session_idle_ttl_s, max_episodes=settings.max_sessions,
                                  tombstones=settings.session_tombstones)
    if store is not None:
        return CachedEpisodeStore(store, set_name, **common)
    refusal = None
    if settings.workers > 1 and settings.session_store is None:
        refusal = (f"episodes need a store shared by the {settings.workers} worker processes: set "
                   "RLSERVE_SESSION_STORE=redis://host:6379/0; requests without an episode_id work as they are")
    return EpisodeStore(refusal=refusal, **common)
