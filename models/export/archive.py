"""Single-file bundle archives (gzip'd tar, ``*.rlsb``) packed and unpacked safely (torch-free).

A bundle is flat: every file sits at the archive root. Unpacking therefore accepts only
regular files with plain names (and a ``.`` directory entry, which ``tar -C dir .`` writes)
and refuses, before writing anything, absolute paths, ``..``, subdirectories, symlinks,
hardlinks, devices, duplicates and archives larger than the limits below.
"""

from __future__ import annotations

import gzip
import os
import re
import tarfile
from pathlib import Path

from rlserve.models.export.errors import BundleError

ARCHIVE_SUFFIX = ".rlsb"
# A plain file name: no separators, no leading dot (so neither '.' nor '..').
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
MAX_MEMBERS = 64
MAX_TOTAL_BYTES = 8 << 30  # 8 GiB: far above any policy, well below a decompression bomb


def check_plain_name(name: str, what: str = "file name") -> str:
    if not isinstance(name, str) or not _PLAIN_NAME.match(name):
        raise BundleError(
            f"{what} {name!r} is not a plain file name (letters, digits, '._-', "
            "no directories, no leading dot)"
        )
    return name


def pack_bundle(bundle_dir: str | os.PathLike[str], archive_path: str | os.PathLike[str]) -> Path:
    """Write the manifest and every file it lists into a gzip'd tar at ``archive_path``.

    The bundle is loaded (and its checksums verified) first, so a broken bundle is never
    packed. Members are written in a fixed order with zeroed owner and time fields, so the
    same bundle packs to the same bytes. The archive appears atomically (temp + rename).
    """
    from rlserve.models.export.bundle import MANIFEST_NAME, load_bundle

    bundle = load_bundle(bundle_dir)
    archive_path = Path(archive_path)
    archive_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive_path.with_name(archive_path.name + ".partial")
    names = [MANIFEST_NAME, *sorted(bundle.manifest.files)]
    try:
        # No name and mtime=0 in the gzip header either, for reproducible bytes.
        with (
            open(tmp, "wb") as raw,
            gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as gz,
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for name in names:
                _add_file(tar, bundle.root / name, name)
        os.replace(tmp, archive_path)
    finally:
        tmp.unlink(missing_ok=True)
    return archive_path


def _add_file(tar: tarfile.TarFile, path: Path, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.size = path.stat().st_size
    info.mode = 0o644
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    with open(path, "rb") as fh:
        tar.addfile(info, fh)


def unpack_bundle(archive: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Path:
    """Extract a bundle archive into ``dest`` (created; must be empty if it exists).

    Every member is checked before the first byte is written; nothing in the archive can
    write outside ``dest``. The result is not yet verified: call ``load_bundle(dest)``.
    """
    archive, dest = Path(archive), Path(dest)
    if not archive.is_file():
        raise BundleError(f"bundle archive {str(archive)!r} does not exist or is not a file")
    try:
        tar = tarfile.open(archive, mode="r:*")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise BundleError(f"{archive}: not a bundle archive (expected a gzip'd tar): {exc}") from exc
    with tar:
        try:
            members = _checked_members(tar, archive)
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise BundleError(f"{archive}: corrupt archive: {exc}") from exc
        dest.mkdir(parents=True, exist_ok=True)
        if any(dest.iterdir()):
            raise BundleError(f"cannot unpack into {str(dest)!r}: the directory is not empty")
        for name, member in members:
            _extract_one(tar, member, dest / name)
    return dest


def _checked_members(tar: tarfile.TarFile, archive: Path) -> list[tuple[str, tarfile.TarInfo]]:
    out: list[tuple[str, tarfile.TarInfo]] = []
    seen: set[str] = set()
    total = 0
    for member in tar.getmembers():
        if len(out) >= MAX_MEMBERS:
            raise BundleError(f"{archive}: more than {MAX_MEMBERS} members; not a bundle")
        name = _member_name(member, archive)
        if name is None:
            continue
        if name in seen:
            raise BundleError(f"{archive}: member {name!r} appears twice")
        seen.add(name)
        total += member.size
        if total > MAX_TOTAL_BYTES:
            raise BundleError(f"{archive}: members exceed {MAX_TOTAL_BYTES} bytes in total")
        out.append((name, member))
    return out


def _member_name(member: tarfile.TarInfo, archive: Path) -> str | None:
    """The plain name a member may be extracted as, ``None`` for the root dir entry."""
    raw = member.name
    if raw.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", raw):
        raise BundleError(f"{archive}: member {raw!r} has an absolute path")
    parts = [p for p in raw.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts:
        raise BundleError(f"{archive}: member {raw!r} escapes the bundle directory ('..')")
    if member.issym() or member.islnk():
        raise BundleError(f"{archive}: member {raw!r} is a link (to {member.linkname!r}); refused")
    if member.isdir() and not parts:
        return None
    if not member.isfile():
        raise BundleError(f"{archive}: member {raw!r} is not a regular file; refused")
    if len(parts) != 1:
        raise BundleError(f"{archive}: member {raw!r} is in a subdirectory; bundles are flat")
    return check_plain_name(parts[0], f"{archive}: member")


def _extract_one(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    source = tar.extractfile(member)
    if source is None:
        raise BundleError(f"cannot read archive member {member.name!r}")
    # 'xb' refuses to open an existing path, so nothing planted in dest is followed.
    with source, open(target, "xb") as out:
        while chunk := source.read(1 << 20):
            out.write(chunk)
