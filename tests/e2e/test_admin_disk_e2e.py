"""Admin uploads cannot fill the disk, unloading frees it, errors keep the server's paths
to themselves, and a misspelt setting stops the start (a real `rlserve serve`).

The server's temporary directory is a folder of the test (``TMPDIR``), so its contents can
be compared before and after. The bundles are the embedded CartPole policy the exporter
wrote, re-versioned with the bundle writer and packed with ``pack_bundle``; the bomb is that
archive with one more member of 64 MiB of zeros (64 KiB gzip'd), and the unpack bound is
8 MiB (``RLSERVE_MAX_UNPACKED_BYTES``), so a bomb that got through would show.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_process import REPO, rlserve_command, running_server

from rlserve.models.export.bundle import MANIFEST_NAME, manifest_digest, pack_bundle, write_manifest

pytestmark = pytest.mark.e2e
CARTPOLE = REPO / "service" / "default_models" / "cartpole"
TOKEN = "disk-e2e-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
OCTET = {**AUTH, "content-type": "application/octet-stream"}
BOUND = 8 << 20
BOMB = 64 << 20
OBS = {"observation": [0.01, -0.02, 0.03, 0.04]}


def _snapshot(folder: Path) -> dict[str, int]:
    """Every file and folder under ``folder`` with its size (folders: -1)."""
    return {str(p.relative_to(folder)): (p.stat().st_size if p.is_file() else -1) for p in sorted(folder.rglob("*"))}


def _versioned(tmp: Path, version: str) -> Path:
    bundle = shutil.copytree(CARTPOLE, tmp / f"cartpole-{version}")
    data = json.loads((bundle / MANIFEST_NAME).read_text())
    data["version"] = version
    write_manifest(bundle, data, list(data["files"]))
    return bundle


def _with_member(archive: bytes, name: str, data: bytes, *, listed: bool) -> bytes:
    """``archive`` plus member ``name``; with ``listed`` the manifest lists it (sha256 and
    size right, digest recomputed), so only the size bound can refuse it."""
    members = []
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(archive))) as tar:
        for member in tar.getmembers():
            source = tar.extractfile(member)
            assert source is not None
            members.append((member.name, source.read()))
    if listed:
        manifest = json.loads(members[0][1])
        manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        manifest["manifest_sha256"] = manifest_digest(manifest)
        members[0] = (MANIFEST_NAME, json.dumps(manifest).encode())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for member_name, content in [*members, (name, data)]:
            info = tarfile.TarInfo(member_name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return gzip.compress(buf.getvalue(), compresslevel=9)


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Iterator[tuple[str, Path, Path, dict[str, bytes]]]:
    """(url, server temp dir, repository, archives) of a server with version 1 (a
    directory) and version 3 (an archive) of cartpole in its repository."""
    base = tmp_path_factory.mktemp("admin_disk")
    repo, server_tmp, work = base / "repo", base / "server-tmp", base / "work"
    for folder in (repo, server_tmp, work):
        folder.mkdir()
    shutil.copytree(CARTPOLE, repo / "cartpole")
    pack_bundle(_versioned(work, "3"), repo / "cartpole-3.rlsb")
    upload = pack_bundle(_versioned(work, "2"), work / "cartpole-2.rlsb").read_bytes()
    archives = {
        "valid": upload,
        "unlisted-bomb": _with_member(upload, "zeros.bin", bytes(BOMB), listed=False),
        "listed-bomb": _with_member(upload, "zeros.bin", bytes(BOMB), listed=True),
    }
    env = {"RLSERVE_ADMIN_TOKEN": TOKEN, "RLSERVE_MAX_UNPACKED_BYTES": str(BOUND), "TMPDIR": str(server_tmp)}
    with running_server(["--repository", str(repo)], env=env) as url:
        yield url, server_tmp, repo, archives


def _no_server_paths(resp: httpx.Response, *paths: Path) -> None:
    for path in (*paths, REPO):
        assert str(path) not in resp.text, f"the answer names {path}: {resp.text[:400]}"


def test_a_bomb_beside_a_valid_bundle_is_refused_and_leaves_the_disk_as_it_was(setup) -> None:
    url, server_tmp, repo, archives = setup
    before = _snapshot(server_tmp)
    assert len(archives["unlisted-bomb"]) < BOMB // 100  # small on the wire, 64 MiB unpacked
    with httpx.Client(base_url=url, timeout=60.0) as client:
        for label in ("unlisted-bomb", "listed-bomb"):
            resp = client.post("/v1/admin/models", content=archives[label], headers=OCTET)
            assert resp.status_code == 422, (label, resp.text)
            error = resp.json()["error"]
            assert (error["code"], error["field"], error["received"]) == ("bundle_invalid", "body", "zeros.bin"), error
            assert "archive member 'zeros.bin'" in error["message"], error
            _no_server_paths(resp, server_tmp, repo)
            assert _snapshot(server_tmp) == before, label
        assert "RLSERVE_MAX_UNPACKED_BYTES" in error["expected"]  # the listed bomb: refused by the bound
        assert client.get("/v1/models/cartpole").json()["versions"] == ["1", "3"]  # nothing else changed


def test_ten_upload_unload_cycles_leave_the_temporary_directory_flat(setup) -> None:
    url, server_tmp, repo, archives = setup
    before = _snapshot(server_tmp)
    with httpx.Client(base_url=url, timeout=60.0) as client:
        for cycle in range(10):
            resp = client.post("/v1/admin/models", content=archives["valid"], headers=OCTET)
            assert resp.status_code == 201, resp.text
            loaded = _snapshot(server_tmp)
            assert len([k for k in loaded if k.startswith("rlsb-") and "/" not in k]) == \
                len([k for k in before if k.startswith("rlsb-") and "/" not in k]) + 1, loaded
            act = client.post("/v1/models/cartpole/versions/2/act", json=OBS)
            assert act.status_code == 200 and act.json()["version"] == "2", act.text
            assert client.delete("/v1/admin/models/cartpole/versions/2", headers=AUTH).status_code == 200
            assert _snapshot(server_tmp) == before, f"cycle {cycle}"


def test_unloading_repository_bundles_keeps_their_files(setup) -> None:
    url, server_tmp, repo, _ = setup
    files = {str(p.relative_to(repo)): p.read_bytes() for p in repo.rglob("*") if p.is_file()}
    before = _snapshot(server_tmp)
    assert [k for k in before if "/" not in k and k.startswith("rlsb-")], \
        "the repository's archive (version 3) is served from an unpacked copy"
    with httpx.Client(base_url=url, timeout=60.0) as client:
        resp = client.delete("/v1/admin/models/cartpole", headers=AUTH)
        assert resp.status_code == 200 and sorted(resp.json()["versions"]) == ["1", "3"]
        # The archive's unpacked copy went with version 3 (anything else there is not ours).
        assert _snapshot(server_tmp) == {k: v for k, v in before.items() if not k.startswith("rlsb-")}
        assert {str(p.relative_to(repo)): p.read_bytes() for p in repo.rglob("*") if p.is_file()} == files
        for path in ("cartpole", "cartpole-3.rlsb"):  # and both load again from the repository
            assert client.post("/v1/admin/models", json={"path": path}, headers=AUTH).status_code == 201


def test_load_errors_name_no_server_path(setup) -> None:
    url, server_tmp, repo, archives = setup
    with httpx.Client(base_url=url, timeout=60.0) as client:
        for body in (
            {"path": ""},
            {"path": "../.."},
            {"path": "/etc"},
            {"path": "nope"},
            {"path": "cartpole/model.onnx"},
            {"path": "a" * 300},
        ):
            resp = client.post("/v1/admin/models", json=body, headers=AUTH)
            assert 400 <= resp.status_code < 500, resp.text
            _no_server_paths(resp, server_tmp, repo, repo.parent)
        for raw in (
            b"garbage" * 100,
            gzip.compress(b"not a tar" * 100),
            archives["valid"][: len(archives["valid"]) // 2],
        ):
            resp = client.post("/v1/admin/models", content=raw, headers=OCTET)
            assert resp.status_code == 422, resp.text
            _no_server_paths(resp, server_tmp, repo, repo.parent)


@pytest.mark.parametrize(("variable", "says"), [
    ("RLSERVE_MAX_BATCH_SIZ", "did you mean RLSERVE_MAX_BATCH_SIZE?"),
    ("RLSERVE_REPLICAS", "no setting has a similar name"),
])
def test_a_misspelt_setting_stops_serve_with_status_2_and_the_suggestion(variable: str, says: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("RLSERVE_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env[variable] = "8"
    done = subprocess.run([*rlserve_command(), "serve", "--port", "0"], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"unknown setting {variable} in the environment: {says}" in done.stderr
