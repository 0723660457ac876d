"""A policy set: several policy bundles served under one name, with the agent mapping (torch-free).

A multi-agent setup (self-play, teams, roles) is a few policies and a rule saying which
agent each one acts for. On disk a policy set is a directory::

    policy_set.json          name, version, created_at, the mapping
                             (``rlserve.models.multiagent.mapping``), and per policy id the
                             member bundle's path and its manifest's digest
    policies/<policy_id>/    a bundle as ``rlserve export`` writes it (or ``<policy_id>.rlsb``)

Every member is an ordinary bundle, exported and verified on its own; the set only adds
the mapping and ties the members to it (a member replaced afterwards no longer matches its
recorded digest and the set refuses to load). Written by ``write_policy_set`` once the
members are in place: ``rlserve export`` exports every policy of a multi-policy checkpoint
into ``policies/`` (``rlserve.models.export.policy_set_export``), or copies bundles the user
lists (``add_member``).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rlserve.models.export.archive import ARCHIVE_SUFFIX, MAX_UNPACKED_BYTES
from rlserve.models.export.bundle import MANIFEST_NAME, Bundle, load_bundle
from rlserve.models.export.errors import BundleError
from rlserve.models.multiagent.mapping import AgentMapping, MappingError

__all__ = [
    "POLICY_SET_MANIFEST",
    "PolicySet",
    "add_member",
    "check_policy_id",
    "is_policy_set",
    "load_policy_set",
    "member_name",
    "write_policy_set",
]

POLICY_SET_MANIFEST = "policy_set.json"
FORMAT = "rlserve-policy-set"
FORMAT_VERSION = 1
MEMBERS_DIR = "policies"
# A policy id names a directory here and the member model ``<name>.<policy_id>`` on the server.
_POLICY_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


def check_policy_id(policy_id: str) -> str:
    if not isinstance(policy_id, str) or not _POLICY_ID.fullmatch(policy_id):
        raise MappingError(f"policy id {policy_id!r} must be 1-64 characters of letters, digits, '_', '.', '-' "
                           "(not starting with '.' or '-')")
    return policy_id


def member_name(set_name: str, policy_id: str) -> str:
    """The model name a member policy is served under (its own Open Inference Protocol model)."""
    return f"{set_name}.{policy_id}"


def is_policy_set(path: Path) -> bool:
    try:
        return path.is_dir() and (path / POLICY_SET_MANIFEST).is_file()
    except OSError:
        return False


@dataclass
class PolicySet:
    """A loaded policy set: its manifest, mapping, and one loaded ``Bundle`` per policy id."""

    root: Path
    data: dict[str, Any]
    mapping: AgentMapping
    bundles: dict[str, Bundle] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.data["name"]

    @property
    def version(self) -> str:
        return self.data["version"]

    @property
    def policy_ids(self) -> list[str]:
        return list(self.data["policies"])

    def close(self) -> None:
        for bundle in self.bundles.values():
            bundle.close()

    def __enter__(self) -> PolicySet:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def add_member(out_dir: Path, policy_id: str, bundle_path: Path) -> str:
    """Copy the bundle (directory or archive) at ``bundle_path`` into the set at ``out_dir``
    as policy ``policy_id``; returns its path relative to ``out_dir``. The bundle is loaded
    and verified first, so a set never holds a member that would not load."""
    check_policy_id(policy_id)
    with load_bundle(bundle_path):
        pass  # raises BundleError naming what is wrong
    relative = f"{MEMBERS_DIR}/{policy_id}" + (ARCHIVE_SUFFIX if bundle_path.is_file() else "")
    target = out_dir / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    if bundle_path.is_file():
        shutil.copyfile(bundle_path, target)
    else:
        shutil.copytree(bundle_path, target)
    return relative


def write_policy_set(out_dir: Path, *, name: str, version: str | None, mapping: AgentMapping,
                     members: Mapping[str, str], source: dict[str, Any] | None = None) -> PolicySet:
    """Write ``policy_set.json`` for members already placed under ``out_dir`` (policy id ->
    relative path), after checking that each loads and the mapping names only these
    policies; returns the set as loaded back."""
    if not members:
        raise MappingError("a policy set needs at least one policy")
    for policy_id in members:
        check_policy_id(policy_id)
    mapping.check_policies(members)
    digests = {}
    for policy_id, relative in members.items():
        with load_bundle(out_dir / relative) as bundle:
            digests[policy_id] = bundle.manifest.data["manifest_sha256"]
    data = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "name": name, "version": version or "1",
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "mapping": mapping.to_json(),
        "policies": {pid: {"path": rel, "manifest_sha256": digests[pid]} for pid, rel in members.items()},
        **({"source": source} if source is not None else {}),
    }
    (out_dir / POLICY_SET_MANIFEST).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return load_policy_set(out_dir)


def load_policy_set(path: Path, *, verify_checksums: bool = True,
                    max_unpacked_bytes: int = MAX_UNPACKED_BYTES) -> PolicySet:
    """Load the set at ``path`` and every member bundle; ``BundleError`` naming what is wrong."""
    data = _read(path)
    try:
        mapping = AgentMapping.from_json(data["mapping"])
        mapping.check_policies(data["policies"])
        for policy_id in data["policies"]:
            check_policy_id(policy_id)
    except MappingError as exc:
        raise BundleError(f"{POLICY_SET_MANIFEST}: {exc}") from exc
    policy_set = PolicySet(path, data, mapping)
    try:
        for policy_id, member in data["policies"].items():
            policy_set.bundles[policy_id] = _load_member(path, policy_id, member, verify_checksums,
                                                         max_unpacked_bytes)
    except BaseException:
        policy_set.close()
        raise
    return policy_set


def _read(path: Path) -> dict[str, Any]:
    file = path / POLICY_SET_MANIFEST
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BundleError(f"{path.name}: no {POLICY_SET_MANIFEST}: not a policy set") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{POLICY_SET_MANIFEST}: not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BundleError(f"{POLICY_SET_MANIFEST}: expected an object with format {FORMAT!r}")
    if data.get("format_version") != FORMAT_VERSION:
        raise BundleError(f"{POLICY_SET_MANIFEST}: format_version {data.get('format_version')!r} is not "
                          f"{FORMAT_VERSION}; this rlserve reads version {FORMAT_VERSION}")
    for key, kind in (("name", str), ("version", str), ("mapping", dict), ("policies", dict)):
        if not isinstance(data.get(key), kind):
            raise BundleError(f"{POLICY_SET_MANIFEST}: field {key!r} should be {kind.__name__}")
    if not data["policies"]:
        raise BundleError(f"{POLICY_SET_MANIFEST}: 'policies' is empty")
    return data


def _load_member(root: Path, policy_id: str, member: Any, verify: bool, max_unpacked_bytes: int) -> Bundle:
    where = f"{POLICY_SET_MANIFEST}: policy {policy_id!r}"
    if not isinstance(member, dict) or not isinstance(member.get("path"), str):
        raise BundleError(f"{where}: expected {{'path': ..., 'manifest_sha256': ...}}")
    relative = Path(member["path"])
    if relative.is_absolute() or ".." in relative.parts:
        raise BundleError(f"{where}: path {member['path']!r} must stay inside the set")
    target = root / relative
    if not (target / MANIFEST_NAME).is_file() and not target.is_file():
        raise BundleError(f"{where}: {member['path']!r} is not a bundle directory or archive")
    try:
        bundle = load_bundle(target, verify_checksums=verify, max_unpacked_bytes=max_unpacked_bytes)
    except BundleError as exc:
        raise BundleError(f"{where} ({member['path']}): {exc}", member=exc.member) from exc
    if verify and bundle.manifest.data.get("manifest_sha256") != member.get("manifest_sha256"):
        bundle.close()
        raise BundleError(f"{where}: the bundle at {member['path']!r} is not the one the set was written with "
                          "(its manifest digest differs); write the set again")
    return bundle
