"""Exports of served RLlib checkpoints, kept between starts (``RLSERVE_EXPORT_CACHE``).

Serving a checkpoint exports it first: torch, the ONNX exporter and the verification take
seconds per policy. The bundle that comes out depends only on the checkpoint's files, on
the exporter (the source of ``rlserve.models`` and the installed torch, onnx, onnxscript,
onnxruntime and numpy) and on the export's options (model name, policy id), so it is kept
under a key that hashes all of them. The next start of the same checkpoint loads the kept
bundle, verified like any bundle (checksums, reference outputs), without importing torch.
A changed checkpoint file, exporter or option gives another key; entries of old keys are
never read again (delete the folder to reclaim the space).

An entry is written under a temporary name and renamed into place, so no reader sees half
of one; a lock file per key makes the workers of ``--workers N`` that start together
export once (the others wait and load the entry).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from functools import lru_cache
from importlib import metadata
from pathlib import Path

import rlserve.models
from rlserve.models.export.bundle import MANIFEST_NAME
from rlserve.models.newstack.layout import algorithm_root, is_new_stack

log = logging.getLogger("rlserve.export_cache")

FORMAT = "2"  # bumped when an entry's layout or the key's recipe changes
# The distributions whose versions shape an export (the model's graph, its checks).
EXPORTER_DISTRIBUTIONS = ("rlserve", "torch", "onnx", "onnxscript", "onnxruntime", "numpy")


def default_root() -> Path:
    """``$XDG_CACHE_HOME/rlserve/exports``, else ``~/.cache/rlserve/exports``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rlserve" / "exports"


def export_key(checkpoint: Path, name: str, policy_id: str | None) -> str:
    """The hash naming the export of ``checkpoint`` (its files' contents, the exporter, the options)."""
    digest = hashlib.sha256()
    root = _content_root(checkpoint)
    inside = checkpoint.resolve().relative_to(root.resolve()).as_posix() if root != checkpoint else ""
    for part in (FORMAT, _exporter_digest(), name, policy_id or "", inside):
        digest.update(part.encode("utf-8", "backslashreplace") + b"\0")
    digest.update(_files_digest(root).encode())
    return digest.hexdigest()[:32]


def _content_root(checkpoint: Path) -> Path:
    """What the export reads: the checkpoint folder, or for one module (or the ``rl_module``
    folder) of a new-stack checkpoint the whole algorithm around it, whose connectors the
    export reads too (the folder's own path inside it is hashed with the options)."""
    root = algorithm_root(checkpoint) if is_new_stack(checkpoint) else None
    return checkpoint if root is None else root


def lookup(root: Path, key: str) -> Path | None:
    """The kept bundle of ``key``, if there is one."""
    entry = root / key
    return entry if (entry / MANIFEST_NAME).is_file() else None


def exported(root: Path, key: str, export: Callable[[Path], None]) -> Path:
    """The kept bundle of ``key``, made by ``export(out_dir)`` if there is none yet.

    Raises ``OSError`` when the cache cannot be used (not writable); what ``export``
    raises passes through, and nothing is kept then."""
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f"{key}.lock"):
        found = lookup(root, key)
        if found is not None:
            return found
        work = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
        try:
            export(work / "bundle")
            os.replace(work / "bundle", root / key)  # atomic: the entry appears whole
        finally:
            shutil.rmtree(work, ignore_errors=True)
    log.info("kept the export in %s", root / key)
    return root / key


def forget(root: Path, key: str) -> None:
    """Remove an entry that no longer loads (files changed or damaged since)."""
    shutil.rmtree(root / key, ignore_errors=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # no POSIX locks: concurrent starts may each export once
        yield
        return
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _files_digest(folder: Path) -> str:
    """sha256 over every file under ``folder``: relative name and content, in name order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode("utf-8", "backslashreplace") + b"\0")
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
        digest.update(b"\0")
    return digest.hexdigest()


@lru_cache(maxsize=1)
def _exporter_digest() -> str:
    """The exporter's identity: the source of ``rlserve.models`` (a change in development
    counts, not only a release) and the versions of the libraries it runs on."""
    digest = hashlib.sha256()
    package = Path(rlserve.models.__file__).parent
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    for name in EXPORTER_DISTRIBUTIONS:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            version = "-"
        digest.update(f"{name}={version}\0".encode())
    return digest.hexdigest()
