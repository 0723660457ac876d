"""Admin loads own their files and keep the server's paths to themselves (in process).

Uploaded archives unpack into the server's temporary directory (pointed at a test folder
here): unloading, a refused upload and a 409 remove what they unpacked; a repository
bundle is never touched. Errors name paths as sent and archive members by name.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import pytest
import svc_bundles
from conftest import error_of

from rlserve.models.export.bundle import pack_bundle, write_manifest

pytestmark = pytest.mark.asyncio

OBS = [0.1, -0.2, 0.3, 0.05]
TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
OCTET = {**AUTH, "Content-Type": "application/octet-stream"}


@pytest.fixture
def scratch(tmp_path, monkeypatch) -> Path:
    """The server's temporary directory for this test."""
    folder = tmp_path / "server-tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _archive(app, tmp_path: Path, version: str, extra: tuple[str, bytes] | None = None) -> bytes:
    bundle = svc_bundles.copy_as_version(app.state.repository / "mlp", tmp_path / f"v{version}", version)
    packed = pack_bundle(bundle, tmp_path / f"mlp-{version}.rlsb").read_bytes()
    if extra is None:
        return packed
    buf = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(packed))) as src, tarfile.open(fileobj=buf, mode="w") as dst:
        for member in src.getmembers():
            dst.addfile(member, src.extractfile(member))
        info = tarfile.TarInfo(extra[0])
        info.size = len(extra[1])
        dst.addfile(info, io.BytesIO(extra[1]))
    return gzip.compress(buf.getvalue())


async def test_unloading_an_upload_deletes_its_files_and_never_a_repository_bundle(make_client, tmp_path, scratch):
    app, client = make_client(("mlp",), admin_token=TOKEN)
    repo_files = sorted(p.name for p in (app.state.repository / "mlp").iterdir())
    held = []  # references that outlive the unload (a request in flight, a log record): no GC saves us
    for cycle in range(3):
        r = await client.post("/v1/admin/models", content=_archive(app, tmp_path / str(cycle), "2"), headers=OCTET)
        assert r.status_code == 201, r.text
        held.append(app.state.registry.entry("mlp").policy("2"))
        assert [p.name[:5] for p in scratch.iterdir()] == ["rlsb-"]  # the upload file is gone already
        assert (await client.post("/v1/models/mlp/act", json={"observation": OBS})).json()["version"] == "2"
        assert (await client.delete("/v1/admin/models/mlp/versions/2", headers=AUTH)).status_code == 200
        assert list(scratch.iterdir()) == []
    assert (await client.delete("/v1/admin/models/mlp", headers=AUTH)).status_code == 200
    assert sorted(p.name for p in (app.state.repository / "mlp").iterdir()) == repo_files


async def test_refused_uploads_leave_nothing_and_name_the_member(make_client, tmp_path, scratch):
    app, client = make_client(("mlp",), admin_token=TOKEN, max_unpacked_bytes=4 << 20)
    bomb = _archive(app, tmp_path / "bomb", "2", extra=("zeros.bin", bytes(16 << 20)))
    r = await client.post("/v1/admin/models", content=bomb, headers=OCTET)
    error = error_of(r)
    assert r.status_code == 422 and error["code"] == "bundle_invalid"
    assert (error["field"], error["received"]) == ("body", "zeros.bin")
    assert "archive member 'zeros.bin' is not a file the manifest lists" in error["message"]
    assert list(scratch.iterdir()) == []
    # The version already loaded: 409, and the unpacked copy goes.
    r = await client.post("/v1/admin/models", content=_archive(app, tmp_path / "again", "1"), headers=OCTET)
    assert r.status_code == 409 and list(scratch.iterdir()) == []
    # A bundle past the bound is refused naming the bound's setting.
    _, small = make_client(("mlp",), admin_token=TOKEN, max_unpacked_bytes=4096)
    r = await small.post("/v1/admin/models", content=_archive(app, tmp_path / "big", "3"), headers=OCTET)
    error = error_of(r)
    assert r.status_code == 422 and "RLSERVE_MAX_UNPACKED_BYTES" in error["expected"], error
    assert list(scratch.iterdir()) == []


async def test_a_bundle_that_fails_to_serve_deletes_its_unpacked_files(make_client, tmp_path, scratch):
    app, client = make_client(("mlp",), admin_token=TOKEN)
    bundle = svc_bundles.copy_as_version(app.state.repository / "mlp", tmp_path / "v5", "5")
    reference = json.loads((bundle / "manifest.json").read_text())["reference"]["file"]
    with np.load(bundle / reference) as stored:
        arrays = {k: (stored[k] + 1 if k.startswith("outputs/") else stored[k]) for k in stored.files}
    np.savez(bundle / reference, **arrays)  # reference outputs the model does not produce
    data = json.loads((bundle / "manifest.json").read_text())
    write_manifest(bundle, data, list(data["files"]))
    r = await client.post("/v1/admin/models", content=pack_bundle(bundle, tmp_path / "v5.rlsb").read_bytes(),
                          headers=OCTET)
    error = error_of(r)
    assert r.status_code == 422 and "cannot be served" in error["message"], error
    assert str(scratch) not in json.dumps(error) and list(scratch.iterdir()) == []


async def test_errors_never_name_the_servers_directories(make_client, scratch):
    app, client = make_client(("mlp",), admin_token=TOKEN)
    repo = str(app.state.repository)
    answers = [
        await client.post("/v1/admin/models", json={"path": ""}, headers=AUTH),
        await client.post("/v1/admin/models", json={"path": "../.."}, headers=AUTH),
        await client.post("/v1/admin/models", json={"path": "nope"}, headers=AUTH),
        await client.post("/v1/admin/models", json={"path": "mlp/model.onnx"}, headers=AUTH),
        await client.post("/v1/admin/models", json={"path": "a" * 5000}, headers=AUTH),
        await client.post("/v1/admin/models", content=b"garbage" * 100, headers=OCTET),
        await client.post("/v1/admin/models", content=b"BZh91AY&SY" + b"\0" * 600, headers=OCTET),
    ]
    for r in answers:
        assert 400 <= r.status_code < 500, r.text
        text = json.dumps(error_of(r))
        assert repo not in text and str(scratch) not in text, text
    assert "bzip2-compressed" in error_of(answers[-1])["message"]
    assert error_of(answers[1])["expected"] == "a path relative to the model repository, staying inside it"
    assert "no manifest.json" in error_of(answers[0])["message"]


async def test_episode_start_on_a_live_session_keeps_its_version(make_client):
    """What docs/api.md promises: only ids that are not live start on a new version."""
    app, client = make_client(("lstm",), admin_token=TOKEN)
    repo = app.state.repository
    svc_bundles.copy_as_version(repo / "lstm", repo / "lstm_v2", "2")
    act = "/v1/models/lstm/act"
    assert (
        await client.post(act, json={"observation": OBS, "session_id": "s", "episode_start": True})
    ).status_code == 200
    assert (
        await client.post(act, json={"observation": OBS, "session_id": "ended", "episode_start": True})
    ).status_code == 200
    assert (await client.post("/v1/admin/models", json={"path": "lstm_v2"}, headers=AUTH)).status_code == 201
    r = await client.post(act, json={"observation": OBS, "session_id": "s", "episode_start": True})
    assert r.json()["version"] == "1"
    assert (await client.delete("/v1/models/lstm/sessions/ended")).status_code == 200
    r = await client.post(act, json={"observation": OBS, "session_id": "ended", "episode_start": True})
    assert r.json()["version"] == "2"
