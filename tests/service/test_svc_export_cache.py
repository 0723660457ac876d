"""The export cache: a served checkpoint is exported once and its bundle kept, keyed by the
checkpoint's content, the exporter and the options; a change of any of them exports again.

The exporter itself is replaced here by a copy of the embedded CartPole bundle (what the
cache keeps is a bundle directory, whatever made it); tests/e2e/test_bench_checkpoint_start_script.py
runs the real export through a real server, twice.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from rlserve.service.errors import BundleInvalid
from rlserve.service.serving import checkpoints, export_cache

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINT = ROOT / "tests" / "fixtures" / "checkpoints" / "ppo_cartpole_msgpack" / "checkpoint"
BUNDLE = ROOT / "service" / "default_models" / "cartpole"


@pytest.fixture
def exports(monkeypatch) -> list[Path]:
    """Every export made (the checkpoint's path), each one a copy of the CartPole bundle."""
    made: list[Path] = []

    def fake_export(path: Path, out: Path, model_name: str, policy_id: str | None) -> None:
        made.append(path)
        shutil.copytree(BUNDLE, out)

    monkeypatch.setattr(checkpoints, "_export", fake_export)
    return made


def test_the_second_load_uses_the_kept_export(tmp_path: Path, exports: list[Path]) -> None:
    cache = tmp_path / "cache"
    first = checkpoints.bundle_from_checkpoint(CHECKPOINT, "mine", cache=cache)
    second = checkpoints.bundle_from_checkpoint(CHECKPOINT, "mine", cache=cache)
    assert exports == [CHECKPOINT]
    key = export_cache.export_key(CHECKPOINT, "mine", None)
    assert first.root == second.root == cache / key
    second.close()  # a kept export outlives its bundles
    assert (cache / key / "manifest.json").is_file()
    assert checkpoints.cached_export(f"mine={CHECKPOINT}", _settings(cache)) == cache / key


def test_the_key_follows_the_content_not_the_path(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(CHECKPOINT, copy)
    key = export_cache.export_key(CHECKPOINT, "mine", None)
    assert export_cache.export_key(copy, "mine", None) == key  # the same files elsewhere
    assert export_cache.export_key(copy, "other", None) != key  # another model name
    assert export_cache.export_key(copy, "mine", "default_policy") != key  # another policy
    victim = next(p for p in sorted(copy.rglob("*")) if p.is_file() and p.stat().st_size > 0)
    data = bytearray(victim.read_bytes())
    data[-1] ^= 1
    victim.write_bytes(bytes(data))
    assert export_cache.export_key(copy, "mine", None) != key  # one changed byte


def test_the_key_follows_the_exporter(monkeypatch) -> None:
    key = export_cache.export_key(CHECKPOINT, "mine", None)
    monkeypatch.setattr(export_cache, "_exporter_digest", lambda: "another exporter")
    assert export_cache.export_key(CHECKPOINT, "mine", None) != key


def test_a_damaged_entry_is_exported_again(tmp_path: Path, exports: list[Path]) -> None:
    cache = tmp_path / "cache"
    checkpoints.bundle_from_checkpoint(CHECKPOINT, "mine", cache=cache).close()
    kept = cache / export_cache.export_key(CHECKPOINT, "mine", None)
    (kept / "model.onnx").write_bytes(b"not the exported model")
    bundle = checkpoints.bundle_from_checkpoint(CHECKPOINT, "mine", cache=cache)
    assert len(exports) == 2 and bundle.root == kept
    assert (kept / "model.onnx").read_bytes() == (BUNDLE / "model.onnx").read_bytes()


def test_an_unusable_cache_exports_into_a_temporary_folder(tmp_path: Path, exports: list[Path]) -> None:
    cache = tmp_path / "a-file"
    cache.write_text("not a folder")
    bundle = checkpoints.bundle_from_checkpoint(CHECKPOINT, "mine", cache=cache)
    assert exports == [CHECKPOINT] and not bundle.root.is_relative_to(cache)
    root = bundle.root
    bundle.close()
    assert not root.exists()  # a temporary export goes with its bundle


def test_a_failed_export_keeps_nothing(tmp_path: Path, monkeypatch) -> None:
    def failing(path: Path, out: Path, model_name: str, policy_id: str | None) -> None:
        out.mkdir()
        raise BundleInvalid("the export failed", field="checkpoint")

    monkeypatch.setattr(checkpoints, "_export", failing)
    cache = tmp_path / "cache"
    with pytest.raises(BundleInvalid, match="the export failed"):
        checkpoints.bundle_from_checkpoint(CHECKPOINT, "mine", cache=cache)
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []


def test_starts_at_once_export_once(tmp_path: Path, monkeypatch) -> None:
    """Two loads at the same time (the workers of --workers 2) export once; both get the entry."""
    made, inside = [], threading.Event()

    def slow_export(path: Path, out: Path, model_name: str, policy_id: str | None) -> None:
        made.append(path)
        inside.set()
        threading.Event().wait(0.3)  # the other load arrives meanwhile and must wait for the lock
        shutil.copytree(BUNDLE, out)

    monkeypatch.setattr(checkpoints, "_export", slow_export)
    cache = tmp_path / "cache"
    roots: list[Path] = []

    def load() -> None:
        roots.append(checkpoints.bundle_from_checkpoint(CHECKPOINT, "mine", cache=cache).root)

    first = threading.Thread(target=load)
    first.start()
    inside.wait(10)
    second = threading.Thread(target=load)
    second.start()
    first.join(30)
    second.join(30)
    assert made == [CHECKPOINT] and len(roots) == 2 and roots[0] == roots[1]


def _settings(cache: Path):
    from rlserve.service.settings import Settings

    return Settings(export_cache=cache)
