"""Bundles made wrong in one place, for the hostile-bundle tests (tests/service and
tests/e2e): a copy of a bundle with files replaced and its manifest edited, checksums and
digest written again so that only the edit is wrong, and its ``.rlsb`` written by hand
(``pack_bundle`` refuses to pack a bundle that does not load)."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

from rlserve.models.export.bundle import MANIFEST_NAME, write_manifest


def edited_copy(src: Path, out: Path, edit=None, files: dict[str, bytes] | None = None) -> Path:
    """``src`` copied to ``out`` as version 2, ``files`` replaced, the manifest edited by ``edit``."""
    shutil.copytree(src, out)
    for name, content in (files or {}).items():
        (out / name).write_bytes(content)
    data = json.loads((out / MANIFEST_NAME).read_text())
    data["version"] = "2"
    if edit is not None:
        edit(data)
    write_manifest(out, data, list(data["files"]))
    return out


def archive(bundle_dir: Path) -> bytes:
    """``bundle_dir`` as an ``.rlsb`` (gzip'd tar, manifest first)."""
    buf = io.BytesIO()
    names = [MANIFEST_NAME, *json.loads((bundle_dir / MANIFEST_NAME).read_text())["files"]]
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in names:
            tar.add(bundle_dir / name, arcname=name)
    return buf.getvalue()
