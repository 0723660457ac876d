"""The archive reader unpacks only what the manifest lists, within a bound, and leaves
nothing behind when it refuses (torch-free).

Archives are built here member by member with ``tarfile``; the valid bundle is the
embedded CartPole policy the exporter wrote (``service/default_models/cartpole``).
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import json
import lzma
import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pytest

from rlserve.models.export.archive import HEADER_BYTES, MAX_MEMBERS, _Budget, unpack_bundle
from rlserve.models.export.bundle import MANIFEST_NAME, load_bundle, pack_bundle
from rlserve.models.export.errors import ArchiveLimitError, BundleError

CARTPOLE = Path(__file__).resolve().parents[2] / "service" / "default_models" / "cartpole"
MiB = 1 << 20


def _bundle_members(root: Path = CARTPOLE) -> list[tuple[str, bytes]]:
    names = [MANIFEST_NAME, *sorted(json.loads((root / MANIFEST_NAME).read_text())["files"])]
    return [(name, (root / name).read_bytes()) for name in names]


def _info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    return info


def _tar_bytes(members: list[tuple[str, bytes]], **tar_kwargs) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, **tar_kwargs) as tar:
        for name, data in members:
            tar.addfile(_info(name, len(data)), io.BytesIO(data))
    return buf.getvalue()


def _write(path: Path, members: list[tuple[str, bytes]]) -> Path:
    path.write_bytes(gzip.compress(_tar_bytes(members), mtime=0))
    return path


def _manifest_listing(files: dict[str, bytes]) -> tuple[str, bytes]:
    listing = {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)} for name, data in files.items()}
    return MANIFEST_NAME, json.dumps({"files": listing}).encode()


def _refused(archive: Path, dest: Path, match: str, **kwargs) -> BundleError:
    with pytest.raises(BundleError, match=match) as info:
        unpack_bundle(archive, dest, **kwargs)
    assert not dest.exists(), f"a refused archive left {sorted(p.name for p in dest.iterdir())}"
    return info.value


# --------------------------------------------------------------------------- formats

def test_a_packed_bundle_unpacks_byte_for_byte(tmp_path: Path) -> None:
    archive = pack_bundle(CARTPOLE, tmp_path / "cartpole.rlsb")
    out = unpack_bundle(archive, tmp_path / "out", max_unpacked_bytes=MiB)
    assert sorted(p.name for p in out.iterdir()) == sorted(name for name, _ in _bundle_members())
    for name, data in _bundle_members():
        assert (out / name).read_bytes() == data


@pytest.mark.parametrize("compression", ["gzip", "none"])
def test_accepted_compressions_load(tmp_path: Path, compression: str) -> None:
    raw = _tar_bytes(_bundle_members())
    archive = tmp_path / "b.rlsb"
    archive.write_bytes(gzip.compress(raw) if compression == "gzip" else raw)
    with load_bundle(archive) as bundle:
        assert bundle.manifest.name == "cartpole"


@pytest.mark.parametrize(
    ("compress", "kind"),
    [
        (bz2.compress, "bzip2"),
        (lzma.compress, "xz"),
        (lambda raw: b"\x28\xb5\x2f\xfd" + raw, "zstd"),  # the zstd frame magic
    ],
)
def test_other_compressions_are_refused_by_name(tmp_path: Path, compress, kind: str) -> None:
    archive = tmp_path / "b.rlsb"
    archive.write_bytes(compress(_tar_bytes(_bundle_members())))
    error = _refused(archive, tmp_path / "out", rf"{kind}-compressed; bundle archives are gzip'd or plain tar")
    assert str(tmp_path) not in str(error)


def test_a_zip_is_not_a_tar(tmp_path: Path) -> None:
    archive = tmp_path / "b.rlsb"
    with zipfile.ZipFile(archive, "w") as zf:
        for name, data in _bundle_members():
            zf.writestr(name, data)
    _refused(archive, tmp_path / "out", "zip-compressed")


# --------------------------------------------------------------------------- the manifest decides

def test_an_unlisted_member_is_refused_by_name_before_it_is_written(tmp_path: Path) -> None:
    archive = _write(tmp_path / "bomb.rlsb", [*_bundle_members(), ("zeros.bin", bytes(8 * MiB))])
    error = _refused(archive, tmp_path / "out", r"archive member 'zeros.bin' is not a file the manifest lists")
    assert error.member == "zeros.bin"


def test_a_listed_member_past_the_bound_is_refused_before_it_is_written(tmp_path: Path) -> None:
    files = {"weights.bin": bytes(2 * MiB)}
    archive = _write(tmp_path / "big.rlsb", [_manifest_listing(files), *files.items()])
    error = _refused(
        archive,
        tmp_path / "out",
        r"'weights.bin' \(2097152 bytes\) would take .* past the limit of 1048576",
        max_unpacked_bytes=MiB,
    )
    assert isinstance(error, ArchiveLimitError) and error.limit == MiB and error.member == "weights.bin"
    unpack_bundle(archive, tmp_path / "roomy", max_unpacked_bytes=3 * MiB)  # the same archive fits a larger bound


def test_the_bound_counts_every_member_and_what_was_written_is_removed(tmp_path: Path) -> None:
    files = {"a.bin": bytes(600 * 1024), "b.bin": bytes(600 * 1024)}
    archive = _write(tmp_path / "two.rlsb", [_manifest_listing(files), *files.items()])
    error = _refused(archive, tmp_path / "deep" / "out", "'b.bin'", max_unpacked_bytes=MiB)
    assert error.member == "b.bin"
    assert not (tmp_path / "deep").exists()  # the directories the reader made are gone too


def test_a_member_larger_than_its_listed_size_is_refused_before_it_is_written(tmp_path: Path) -> None:
    name, manifest = _manifest_listing({"model.bin": b"small"})
    archive = _write(tmp_path / "lie.rlsb", [(name, manifest), ("model.bin", bytes(MiB))])
    error = _refused(archive, tmp_path / "out", r"'model.bin' holds 1048576 bytes; the manifest lists 5")
    assert error.member == "model.bin"


def test_a_pax_size_larger_than_the_tar_header_size_is_the_size_checked(tmp_path: Path) -> None:
    """The ustar header says 5 bytes (what the manifest lists) while a pax record says
    1 MiB and that much data follows: the size the reader streams is the one compared."""
    name, manifest = _manifest_listing({"model.bin": b"small"})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_info(name, len(manifest)), io.BytesIO(manifest))
        info = _info("model.bin", MiB)
        info.pax_headers = {"size": str(MiB)}
        tar.addfile(info, io.BytesIO(bytes(MiB)))
    raw = bytearray(buf.getvalue())
    header = raw.rfind(b"model.bin\x00", 0, len(raw) - MiB)  # the ustar header of the data member
    raw[header + 124:header + 136] = b"%011o\x00" % 5
    raw[header + 148:header + 156] = b"        "
    raw[header + 148:header + 156] = b"%06o\x00 " % sum(raw[header:header + 512])
    assert tarfile.TarInfo.frombuf(bytes(raw[header:header + 512]), "utf-8", "surrogateescape").size == 5
    archive = tmp_path / "pax.rlsb"
    archive.write_bytes(bytes(raw))
    _refused(archive, tmp_path / "out", r"'model.bin' holds 1048576 bytes; the manifest lists 5")


def test_a_checksum_mismatch_is_refused_and_nothing_stays(tmp_path: Path) -> None:
    members = _bundle_members()
    name, data = members[1]
    members[1] = (name, bytes(b ^ 0xFF for b in data[:16]) + data[16:])
    archive = _write(tmp_path / "tampered.rlsb", members)
    error = _refused(archive, tmp_path / "out", rf"archive member '{name}': sha256 .* does not match the manifest's")
    assert error.member == name


def test_the_manifest_must_come_first(tmp_path: Path) -> None:
    members = _bundle_members()
    archive = _write(tmp_path / "late.rlsb", [members[1], members[0], *members[2:]])
    error = _refused(archive, tmp_path / "out", rf"'{members[1][0]}' comes before manifest.json")
    assert error.member == members[1][0]


def test_a_listed_file_missing_from_the_archive_is_refused(tmp_path: Path) -> None:
    members = _bundle_members()
    archive = _write(tmp_path / "short.rlsb", members[:-1])
    _refused(archive, tmp_path / "out", rf"lacks files its manifest lists: \['{members[-1][0]}'\]")


def test_a_truncated_archive_leaves_nothing(tmp_path: Path) -> None:
    raw = _tar_bytes(_bundle_members())
    archive = tmp_path / "cut.rlsb"
    archive.write_bytes(raw[: len(raw) // 2])  # plain tar, cut in the middle of a member
    _refused(archive, tmp_path / "out", "corrupt archive")


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        (b"[1, 2]", "no 'files' object"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
        (json.dumps({"files": {"a.bin": {"sha256": "00"}}}).encode(), r"files\['a.bin'\] should be"),
        (json.dumps({"files": {"../a": {"sha256": "0" * 64, "bytes": 1}}}).encode(), "not a plain file name"),
        # re.match's '$' matches before a final newline: a name or digest ending in one passed.
        (json.dumps({"files": {"a.bin\n": {"sha256": "0" * 64, "bytes": 1}}}).encode(), "not a plain file name"),
        (json.dumps({"files": {"a.bin": {"sha256": "0" * 64 + "\n", "bytes": 1}}}).encode(), r"files\['a.bin'\]"),
    ],
)
def test_a_manifest_the_reader_cannot_follow_is_refused(tmp_path: Path, manifest: bytes, message: str) -> None:
    archive = _write(tmp_path / "m.rlsb", [(MANIFEST_NAME, manifest)])
    error = _refused(archive, tmp_path / "out", message)
    assert error.member in (MANIFEST_NAME, None)


# --------------------------------------------------------------------------- the stream itself is bounded

def test_an_oversized_header_is_cut_off(tmp_path: Path) -> None:
    """tarfile holds pax records in memory: one past HEADER_BYTES is refused while read."""
    name, manifest = _manifest_listing({"a.bin": b"x"})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_info(name, len(manifest)), io.BytesIO(manifest))
        info = _info("a.bin", 1)
        info.pax_headers = {"comment": "x" * (2 * HEADER_BYTES)}
        tar.addfile(info, io.BytesIO(b"x"))
    archive = tmp_path / "pax.rlsb"
    archive.write_bytes(gzip.compress(buf.getvalue()))
    _refused(archive, tmp_path / "out", "header takes more than")


def test_the_budget_stops_decompressing_at_its_cap() -> None:
    bomb = gzip.GzipFile(fileobj=io.BytesIO(gzip.compress(bytes(64 * MiB))), mode="rb")
    budget = _Budget(bomb)
    budget.allow(MiB, BundleError("past the cap"))
    read = 0
    with pytest.raises(BundleError, match="past the cap"):
        while chunk := budget.read(10240):
            read += len(chunk)
    assert MiB - 10240 < read <= MiB and budget.consumed == MiB + 1  # one byte past the cap, no more


def test_more_than_max_members_is_refused(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for _ in range(MAX_MEMBERS + 1):
            info = tarfile.TarInfo(".")
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
    archive = tmp_path / "dots.rlsb"
    archive.write_bytes(buf.getvalue())
    _refused(archive, tmp_path / "out", f"more than {MAX_MEMBERS} members")


# --------------------------------------------------------------------------- who owns the unpacked files

def test_close_deletes_an_unpacked_archive_and_never_a_directory_bundle(tmp_path: Path, monkeypatch) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    archive = pack_bundle(CARTPOLE, tmp_path / "cartpole.rlsb")
    bundle = load_bundle(archive)
    assert bundle.root.parent == scratch and bundle.root.name.startswith("rlsb-")
    bundle.close()
    assert list(scratch.iterdir()) == []
    bundle.close()  # twice is fine
    copy = shutil.copytree(CARTPOLE, tmp_path / "dir-bundle")
    with load_bundle(copy) as by_path:
        assert by_path.root == copy
    assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in CARTPOLE.iterdir())


def test_a_failed_load_leaves_no_unpacked_directory(tmp_path: Path, monkeypatch) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    members = _bundle_members()
    manifest = json.loads(members[0][1])
    manifest["explore"] = not manifest["explore"]  # the manifest digest no longer matches
    archive = _write(tmp_path / "edited.rlsb", [(MANIFEST_NAME, json.dumps(manifest).encode()), *members[1:]])
    with pytest.raises(BundleError, match="manifest_sha256 does not match"):
        load_bundle(archive)
    with pytest.raises(ArchiveLimitError):
        load_bundle(pack_bundle(CARTPOLE, tmp_path / "ok.rlsb"), max_unpacked_bytes=1024)
    assert list(scratch.iterdir()) == []


def test_messages_never_name_the_unpack_directory(tmp_path: Path, monkeypatch) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    members = _bundle_members()
    manifest = json.loads(members[0][1])
    manifest["format_version"] = 99
    archive = _write(tmp_path / "future.rlsb", [(MANIFEST_NAME, json.dumps(manifest).encode()), *members[1:]])
    with pytest.raises(BundleError) as info:
        load_bundle(archive)
    assert str(info.value).startswith("manifest.json: format_version 99") and str(scratch) not in str(info.value)
