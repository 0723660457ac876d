"""Replicas that share one model repository: polling it, and saving uploads into it.

A model loaded through one replica's admin API must become servable on every replica (a
session bound to it may be stepped anywhere). The repository is the one shared truth:
an uploaded archive is written into it (``save_upload``, atomically: a hidden temporary
name, then a rename), a path load names a bundle already in it, and every replica looks
for bundles it has not tried yet every ``RLSERVE_REPOSITORY_POLL_S`` seconds
(``poll_repository``), as Triton's poll mode does. Polling needs nothing but a shared
directory (a volume), works with any number of replicas, and a replica that starts later
simply loads what is there; the price is up to one poll interval before a new version is
servable everywhere (a request for a session bound to it meanwhile answers 503 with
Retry-After).

Only additions propagate: unloading stays per replica (``DELETE /v1/admin/models/...``
on each), so that a version still serving sessions elsewhere is never pulled by one
replica's decision. A bundle directory copied in by hand should be copied under a hidden
name and renamed, so a poll never sees it half written (a failed load is retried when
the bundle's files change).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from rlserve.models.export.archive import ARCHIVE_SUFFIX
from rlserve.service.errors import BundleInvalid, VersionConflict
from rlserve.service.serving.loading import discover_bundles, fingerprint
from rlserve.service.serving.policy import Policy
from rlserve.service.serving.registry import ModelRegistry

log = logging.getLogger("rlserve.repository")

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


async def load_new_bundles(registry: ModelRegistry, root: Path) -> list[str]:
    """Load every bundle under ``root`` this replica has not tried yet (or that changed
    since it failed); returns the ``name:version`` keys now serving."""
    loaded = []
    for path in await asyncio.to_thread(discover_bundles, root):
        key, stamp = str(path), fingerprint(path)
        shown = str(path.relative_to(root))  # failures are listed on the public /readyz by this name
        tried = registry.seen.get(key)
        if tried is not None and (shown not in registry.failures or tried == stamp):
            continue
        registry.seen[key] = stamp
        try:
            policy = await asyncio.to_thread(registry.load_policy, path, shown=shown)
        except BundleInvalid as exc:
            registry.failures[shown] = exc.message
            log.error("repository poll: skipping %s: %s", path, exc.message)
            continue
        registry.failures.pop(shown, None)
        try:
            registry.add(policy)
        except VersionConflict:
            log.info("repository poll: %s is loaded already", policy.key)
            await policy.close()  # its batcher never served; an archive's unpacked files go
            continue
        except BundleInvalid as exc:
            registry.failures[shown] = exc.message
            await policy.close()
            continue
        loaded.append(policy.key)
        log.info("repository poll: loaded %s from %s", policy.key, path)
    return loaded


async def poll_repository(registry: ModelRegistry, root: Path, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await load_new_bundles(registry, root)
        except Exception:  # a poll that fails (a vanished directory) must not end polling
            log.exception("repository poll of %s failed", root)


def save_upload(registry: ModelRegistry, root: Path, archive: Path, policy: Policy) -> Path | None:
    """Copy an uploaded archive that now serves ``policy`` into the repository as
    ``<name>/<version>.rlsb`` (never over an existing file); the path, or None when it is
    there already. Marked as tried first, so this replica's own poll skips it."""
    folder = root / _safe(policy.name)
    target = folder / f"{_safe(policy.version)}{ARCHIVE_SUFFIX}"
    if target.exists():
        return None
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".upload-", suffix=ARCHIVE_SUFFIX, dir=folder)
    try:
        with os.fdopen(fd, "wb") as out, archive.open("rb") as source:
            shutil.copyfileobj(source, out)
            out.flush()
            os.fsync(out.fileno())
        registry.seen[str(target)] = -1.0  # tried (loaded here); a poll only retries failures
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _safe(name: str) -> str:
    cleaned = _UNSAFE.sub("_", name).lstrip(".")
    return cleaned or "_"
