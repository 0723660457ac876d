"""Single-file bundle archives (``*.rlsb``) unpacked safely (torch-free).

An archive is a tar of the bundle's files, gzip-compressed (what ``pack_bundle`` writes:
``bundle.py``, since it loads the bundle first; and ``rlserve export --archive``) or plain.
Other compressions (bzip2, xz, zstd, ...) and other formats are refused: nothing rlserve
writes uses them, and their decompressors cost more CPU and memory per byte of archive.

A bundle is flat and self-describing, so unpacking follows its manifest, member by member:
the archive's first file must be ``manifest.json``, and every later member must be a file
the manifest lists, with the size it lists; its sha256 is computed while it is written.
Refused before a byte of a member is written: absolute paths, ``..``, subdirectories, links,
devices and anything else that is not a regular file (a ``.`` directory entry, which
``tar -C dir .`` writes, is skipped), duplicates, members the manifest does not list or
lists with another size, more than ``MAX_MEMBERS`` members, and a member that would take the
unpacked total past the caller's bound. The decompressed stream itself is cut off at what
the accepted members and their headers may take, so no header can make the reader
decompress, hold or write more. On any refusal, whatever was written is removed.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from rlserve.models.export.errors import ArchiveLimitError, BundleError

ARCHIVE_SUFFIX = ".rlsb"
MANIFEST_NAME = "manifest.json"
ACCEPTED_COMPRESSIONS = ("gzip", "none")
MAX_MEMBERS = 64
MAX_UNPACKED_BYTES = 1 << 30  # the default bound: far above any policy, far below a bomb
MAX_MANIFEST_BYTES = 64 << 20  # the manifest is read into memory before it is written
# Decompressed bytes one member's header may take: its 512-byte blocks, any pax or GNU
# long-name records (tarfile holds these in memory) and the tar reader's 10 KiB read-ahead.
HEADER_BYTES = 1 << 20
_CHUNK = 1 << 20
_OTHER_FORMATS = ((b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"),
                  (b"\x04\x22\x4d\x18", "lz4"), (b"\x1f\x9d", "compress (.Z)"), (b"PK\x03\x04", "zip"))
# A plain file name: no separators, no leading dot (so neither '.' nor '..'); also the rule
# of a model's name and version (``names.py``), stored as ``<name>/<version>.rlsb``.
PLAIN_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def check_plain_name(name: str, what: str = "file name") -> str:
    if not isinstance(name, str) or not PLAIN_NAME.fullmatch(name):  # match's '$' also takes a final newline
        raise BundleError(
            f"{what} {_show(name)} is not a plain file name (letters, digits, '._-', "
            "no directories, no leading dot)"
        )
    return name


def _show(name: object, limit: int = 120) -> str:
    text = repr(name)
    return text if len(text) <= limit else text[:limit - 4] + "...'"


# --------------------------------------------------------------------------- unpacking

def archive_compression(head: bytes) -> str:
    """``'gzip'`` or ``'none'`` for an accepted archive's first 512 bytes; else ``BundleError``."""
    if head.startswith(b"\x1f\x8b"):
        return "gzip"
    if head[257:262] == b"ustar":  # the POSIX tar magic (ustar, pax and GNU tars carry it)
        return "none"
    for magic, kind in _OTHER_FORMATS:
        if head.startswith(magic):
            raise BundleError(f"the archive is {kind}-compressed; bundle archives are gzip'd or plain tar")
    raise BundleError("not a bundle archive (expected a gzip'd or plain tar)")


def unpack_bundle(
    archive: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    max_unpacked_bytes: int = MAX_UNPACKED_BYTES,
) -> Path:
    """Unpack a bundle archive into ``dest`` (created; must be empty if it exists).

    Writes at most ``max_unpacked_bytes`` bytes; ``ArchiveLimitError`` when the archive's
    files would take more. Nothing in the archive can write outside ``dest``, and nothing
    stays there when the archive is refused. The files' checksums are verified; the
    manifest's own digest and structure are ``load_bundle(dest)``'s to check.
    """
    archive, dest = Path(archive), Path(dest)
    if not archive.is_file():
        raise BundleError(f"bundle archive {str(archive)!r} does not exist or is not a file")
    if dest.is_dir() and any(dest.iterdir()):
        raise BundleError(f"cannot unpack into {str(dest)!r}: the directory is not empty")
    writer = _Writer(dest)
    try:
        with open(archive, "rb") as raw:
            compression = archive_compression(raw.read(512))
            raw.seek(0)
            stream: _Readable = gzip.GzipFile(fileobj=raw, mode="rb") if compression == "gzip" else raw
            _unpack_stream(stream, writer, max_unpacked_bytes)
    except BaseException:
        writer.remove()
        raise
    return dest


class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


@dataclass(frozen=True)
class _Listed:
    """A file the manifest lists: its size and sha256."""

    size: int
    sha256: str


class _Budget:
    """The decompressed stream, cut off once more than the bytes ``allow`` grants are read."""

    def __init__(self, stream: _Readable):
        self.stream = stream
        self.consumed = 0
        self.cap = 0
        self.error = BundleError("")

    def allow(self, more: int, error: BundleError) -> None:
        """``more`` bytes past what was read so far; ``error`` is raised past them."""
        self.cap = self.consumed + more
        self.error = error

    def read(self, size: int = -1) -> bytes:
        room = self.cap - self.consumed
        data = self.stream.read(room + 1 if size < 0 else min(size, room + 1))
        self.consumed += len(data)
        if self.consumed > self.cap:
            raise self.error
        return data


class _Writer:
    """Writes members into ``dest`` (created on the first file); ``remove`` undoes it all."""

    def __init__(self, dest: Path):
        self.dest = dest
        self.files: list[Path] = []
        self.created: list[Path] = []  # directories this writer made, deepest first

    def open(self, name: str) -> BinaryIO:
        if not self.dest.is_dir():
            self.created = [p for p in (self.dest, *self.dest.parents) if not p.exists()]
            self.dest.mkdir(parents=True, exist_ok=True)
        path = self.dest / name
        # 'xb' refuses to open an existing path, so nothing planted in dest is followed.
        out = open(path, "xb")
        self.files.append(path)
        return out

    def remove(self) -> None:
        for path in self.files:
            path.unlink(missing_ok=True)
        for folder in self.created:
            try:
                folder.rmdir()
            except OSError:  # not empty: someone else's files
                break


def _unpack_stream(stream: _Readable, writer: _Writer, bound: int) -> None:
    budget = _Budget(stream)
    header_too_big = BundleError(f"an archive member's header takes more than {HEADER_BYTES} bytes; refused")
    budget.allow(HEADER_BYTES, header_too_big)
    listed: dict[str, _Listed] | None = None
    seen: set[str] = set()
    total = count = 0
    try:
        # 'r|': a stream, read once front to back; no compression of tarfile's own, whose
        # decompressor does not bound how much one read may inflate to. (typeshed wants an
        # IO[bytes]; a stream needs only read().)
        with tarfile.open(fileobj=budget, mode="r|") as tar:  # type: ignore[call-overload]
            while True:
                budget.allow(HEADER_BYTES, header_too_big)
                member = tar.next()
                if member is None:
                    break
                count += 1
                if count > MAX_MEMBERS:
                    raise BundleError(f"the archive has more than {MAX_MEMBERS} members; not a bundle")
                name = _member_name(member)
                if name is None:
                    continue
                if name in seen:
                    raise BundleError(f"archive member {name!r} appears twice", member=name)
                seen.add(name)
                entry = _admit(name, member.size, listed, total, bound)
                total += member.size
                budget.allow(member.size + HEADER_BYTES,
                             BundleError(f"archive member {name!r} streams more than its {member.size} bytes; cut off",
                                         member=name))
                source = tar.extractfile(member)
                assert source is not None  # a regular file (_member_name)
                if entry is None:  # the manifest: read whole, so the rest can be checked against it
                    data = _read_exactly(source, name, member.size)
                    listed = _listed_files(data)
                    with writer.open(name) as out:
                        out.write(data)
                else:
                    _write_checked(source, writer, name, entry)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise BundleError(f"corrupt archive: {exc}") from exc
    if listed is None:
        raise BundleError(f"the archive holds no {MANIFEST_NAME}; not a bundle")
    missing = sorted(set(listed) - seen)
    if missing:
        raise BundleError(f"the archive lacks files its manifest lists: {missing}")


def _admit(name: str, size: int, listed: dict[str, _Listed] | None, total: int, bound: int) -> _Listed | None:
    """The manifest's entry for member ``name`` (``None`` for the manifest itself), or why
    the member is refused before anything of it is written."""
    entry = None
    if listed is None:
        if name != MANIFEST_NAME:
            raise BundleError(f"archive member {name!r} comes before {MANIFEST_NAME}; a bundle archive starts "
                              "with its manifest (pack_bundle and rlserve export --archive write it first)",
                              member=name)
        if size > MAX_MANIFEST_BYTES:
            raise BundleError(f"archive member {name!r} holds {size} bytes; a manifest may hold {MAX_MANIFEST_BYTES}",
                              member=name)
    else:
        entry = listed.get(name)
        if entry is None:
            raise BundleError(f"archive member {name!r} is not a file the manifest lists "
                              f"({sorted(listed)}); refused", member=name)
        if size != entry.size:
            raise BundleError(f"archive member {name!r} holds {size} bytes; the manifest lists {entry.size}",
                              member=name)
    if total + size > bound:
        raise ArchiveLimitError(f"archive member {name!r} ({size} bytes) would take the unpacked bundle past "
                                f"the limit of {bound} bytes", limit=bound, member=name)
    return entry


def _member_name(member: tarfile.TarInfo) -> str | None:
    """The plain name a member may be written as, ``None`` for the root dir entry."""
    raw = member.name
    shown = _show(raw)
    if raw.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", raw):
        raise BundleError(f"archive member {shown} has an absolute path", member=raw)
    parts = [p for p in raw.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts:
        raise BundleError(f"archive member {shown} escapes the bundle directory ('..')", member=raw)
    if member.issym() or member.islnk():
        raise BundleError(f"archive member {shown} is a link (to {_show(member.linkname)}); refused", member=raw)
    if member.isdir() and not parts:
        return None
    if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):  # not sparse, contiguous, device, ...
        raise BundleError(f"archive member {shown} is not a regular file; refused", member=raw)
    if len(parts) != 1:
        raise BundleError(f"archive member {shown} is in a subdirectory; bundles are flat", member=raw)
    return check_plain_name(parts[0], "archive member")


def _read_exactly(source: BinaryIO, name: str, size: int) -> bytes:
    data = source.read(size + 1)
    if len(data) != size:
        raise BundleError(f"archive member {name!r} holds {len(data)} bytes, not its declared {size}", member=name)
    return data


def _listed_files(data: bytes) -> dict[str, _Listed]:
    """The ``files`` the manifest lists, each with the size and sha256 it must have."""
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BundleError(f"{MANIFEST_NAME}: not valid JSON: {exc}", member=MANIFEST_NAME) from exc
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        raise BundleError(f"{MANIFEST_NAME}: no 'files' object naming the bundle's files", member=MANIFEST_NAME)
    listed = {}
    for name, entry in files.items():
        check_plain_name(name, f"{MANIFEST_NAME}: listed file")
        size = entry.get("bytes") if isinstance(entry, dict) else None
        digest = entry.get("sha256") if isinstance(entry, dict) else None
        if (not isinstance(size, int) or isinstance(size, bool) or size < 0
                or not isinstance(digest, str) or not _SHA256.fullmatch(digest)):
            raise BundleError(f"{MANIFEST_NAME}: files[{name!r}] should be {{'sha256': 64 hex digits, "
                              f"'bytes': a size}}, got {_show(entry)}", member=MANIFEST_NAME)
        listed[name] = _Listed(size, digest)
    return listed


def _write_checked(source: BinaryIO, writer: _Writer, name: str, entry: _Listed) -> None:
    """Copy a member, cut off past its listed size; its sha256 must be the listed one."""
    digest = hashlib.sha256()
    done = 0
    with writer.open(name) as out:
        while chunk := source.read(min(_CHUNK, entry.size - done + 1)):
            done += len(chunk)
            if done > entry.size:
                raise BundleError(f"archive member {name!r} streams more than its {entry.size} bytes; cut off",
                                  member=name)
            digest.update(chunk)
            out.write(chunk)
    if done != entry.size:
        raise BundleError(f"archive member {name!r} ends after {done} of its {entry.size} bytes", member=name)
    if digest.hexdigest() != entry.sha256:
        raise BundleError(f"archive member {name!r}: sha256 {digest.hexdigest()} does not match the manifest's "
                          f"{entry.sha256}; the file was modified", member=name)
