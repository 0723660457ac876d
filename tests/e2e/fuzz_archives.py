"""Hostile ``.rlsb`` uploads for the admin fuzz cases: the embedded CartPole bundle (a real
export) packed with one thing wrong each. Every one must be refused with 422
``bundle_invalid`` naming the body, before it changes anything (the bundle's version is
the one already loaded, so even a wrongly accepted upload could only get a 409).
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import tarfile
import zipfile

from fuzz_inputs import DEFAULTS

MANIFEST = "manifest.json"


def _members() -> list[tuple[str, bytes]]:
    root = DEFAULTS / "cartpole"
    names = [MANIFEST, *sorted(json.loads((root / MANIFEST).read_text())["files"])]
    return [(name, (root / name).read_bytes()) for name in names]


def _tar(members: list[tuple[str, bytes]], link: tuple[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if link is not None:
            info = tarfile.TarInfo(link[0])
            info.type, info.linkname = tarfile.SYMTYPE, link[1]
            tar.addfile(info)
    return buf.getvalue()


def _zip(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members:
            zf.writestr(name, data)
    return buf.getvalue()


def hostile_archives() -> dict[str, bytes]:
    members = _members()
    plain = _tar(members)
    name, data = members[1]
    return {
        "bzip2": bz2.compress(plain),
        "xz": lzma.compress(plain),
        "zip": _zip(members),
        "unlisted-member": gzip.compress(_tar([*members, ("zeros.bin", bytes(4 << 20))])),
        "manifest-last": gzip.compress(_tar([*members[1:], members[0]])),
        "truncated": gzip.compress(plain)[: len(gzip.compress(plain)) // 2],
        "symlink-member": gzip.compress(_tar(members[:1], link=(name, "/etc/passwd"))),
        "absolute-member": gzip.compress(_tar([*members, ("/srv/x", b"x")])),
        "dotdot-member": gzip.compress(_tar([*members, ("../x", b"x")])),
        "subdir-member": gzip.compress(_tar([*members, ("sub/x", b"x")])),
        "longer-than-listed": gzip.compress(_tar([members[0], (name, data + b"\0"), *members[2:]])),
        "checksum-mismatch": gzip.compress(_tar([members[0], (name, bytes(len(data))), *members[2:]])),
        "missing-listed-file": gzip.compress(_tar(members[:-1])),
    }
