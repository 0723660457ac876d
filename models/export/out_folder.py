"""``rlserve export --out DIR``: the folder an export writes, and ``--force`` replacing one.

An export writes into a folder that does not exist or is empty. Two readers of the docs
export the same checkpoint twice, or re-run a command after changing a flag: the second
export then meets the first one's folder. ``--force`` replaces it, but only when it is an
rlserve export (a bundle's ``manifest.json`` or a policy set's ``policy_set.json``, each
saying its format), so a typo in ``--out`` never deletes a user's own files. The old export
is moved aside while the new one is written and comes back if the export fails.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlserve.models.export.bundle import FORMAT as BUNDLE_FORMAT
from rlserve.models.export.bundle import MANIFEST_NAME
from rlserve.models.multiagent.policy_set import FORMAT as SET_FORMAT
from rlserve.models.multiagent.policy_set import POLICY_SET_MANIFEST

__all__ = ["OutFolderError", "is_export", "replacing"]


class OutFolderError(ValueError):
    """``--out`` names a folder this export must not write into (exit status 2)."""


def is_export(path: Path) -> bool:
    """True for a folder ``rlserve export`` wrote: a bundle or a policy set, by its manifest's format."""
    for name, form in ((MANIFEST_NAME, BUNDLE_FORMAT), (POLICY_SET_MANIFEST, SET_FORMAT)):
        try:
            data = json.loads((path / name).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(data, dict) and data.get("format") == form:
            return True
    return False


def _in_use(path: Path) -> bool:
    return path.is_symlink() or (path.exists() and (not path.is_dir() or any(path.iterdir())))


@contextmanager
def replacing(out: Path, force: bool) -> Iterator[None]:
    """Let an export write ``out``: free (missing or empty), or an earlier export that
    ``force`` allows to replace (moved aside now, deleted once the body succeeded, put back
    if it failed). ``OutFolderError`` for anything else."""
    if not _in_use(out):
        yield
        return
    if not force:
        raise OutFolderError(f"--out: {str(out)!r} exists and is not empty: pass --force to replace the export "
                             "there, or choose another --out folder")
    if out.is_symlink() or not out.is_dir() or not is_export(out):
        raise OutFolderError(f"--force: {str(out)!r} is not an rlserve export (no {MANIFEST_NAME} or "
                             f"{POLICY_SET_MANIFEST} of one): not replacing it; choose another --out folder")
    aside = out.with_name(f".{out.name}.replaced-{os.getpid()}")
    out.rename(aside)
    try:
        yield
    except BaseException:
        if out.exists():  # what the failed export left (the name was free when it began)
            shutil.rmtree(out)
        aside.rename(out)
        raise
    shutil.rmtree(aside)
