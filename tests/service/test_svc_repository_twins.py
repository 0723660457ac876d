"""`rlserve export --archive` writes DIR and DIR.rlsb side by side; a repository holding both
serves the bundle once with nothing failed, while two different bundles claiming one
name and version are still a conflict."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rlserve.models.export.bundle import pack_bundle, write_manifest
from rlserve.service.app import create_app
from rlserve.service.settings import Settings

CARTPOLE = Path(__file__).resolve().parents[2] / "service" / "default_models" / "cartpole"


def _registry(repo: Path):
    return create_app(Settings(repository=repo)).state.registry


def test_a_directory_and_its_archive_are_one_bundle(tmp_path: Path) -> None:
    shutil.copytree(CARTPOLE, tmp_path / "my-policy")
    pack_bundle(tmp_path / "my-policy", tmp_path / "my-policy.rlsb")
    registry = _registry(tmp_path)
    assert registry.failures == {}
    assert {name: list(entry.versions) for name, entry in registry.entries.items()} == {"cartpole": ["1"]}


def test_two_different_bundles_of_one_name_and_version_still_conflict(tmp_path: Path) -> None:
    shutil.copytree(CARTPOLE, tmp_path / "a")
    other = shutil.copytree(CARTPOLE, tmp_path / "b")
    data = json.loads((other / "manifest.json").read_text())
    files = list(data.pop("files"))
    data.pop("manifest_sha256")
    data["created_at"] = "2000-01-01T00:00:00Z"  # another export of the same name and version
    write_manifest(other, data, files)
    registry = _registry(tmp_path)
    # b, exported "earlier", loads first; a, a different bundle of the same version, conflicts.
    assert list(registry.failures) == ["a"] and "already loaded" in registry.failures["a"]
