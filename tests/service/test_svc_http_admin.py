"""The admin API: auth, load (path / archive), version routing, unload, failed loads."""

from __future__ import annotations

import json
import os

import pytest
import svc_bundles
from conftest import error_of

from rlserve.models.export.bundle import pack_bundle

pytestmark = pytest.mark.asyncio

OBS = [0.1, -0.2, 0.3, 0.05]
TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_admin_disabled_without_token(make_client):
    _, client = make_client(("mlp",))
    r = await client.get("/v1/admin/models", headers=AUTH)
    assert r.status_code == 404 and error_of(r)["code"] == "admin_disabled"
    assert "RLSERVE_ADMIN_TOKEN" in error_of(r)["message"]


async def test_admin_needs_the_right_token(make_client):
    _, client = make_client(("mlp",), admin_token=TOKEN)
    r = await client.get("/v1/admin/models")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    r = await client.get("/v1/admin/models", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 403 and error_of(r)["code"] == "forbidden"
    r = await client.get("/v1/admin/models", headers=AUTH)
    assert r.status_code == 200
    assert [(m["name"], m["version"], m["current"]) for m in r.json()["models"]] == [("mlp", "1", True)]


async def test_new_version_takes_new_sessions_old_sessions_stay(make_client):
    app, client = make_client(("lstm",), admin_token=TOKEN)
    repo = app.state.repository
    svc_bundles.copy_as_version(repo / "lstm", repo / "lstm_v2", "2")
    await client.post("/v1/models/lstm/act", json={"observation": OBS, "session_id": "old", "episode_start": True})
    r = await client.post("/v1/admin/models", json={"path": "lstm_v2"}, headers=AUTH)
    assert r.status_code == 201 and r.json() == {"name": "lstm", "version": "2", "current": True}

    def version_of(response):
        assert response.status_code == 200, response.text
        return response.json()["version"]

    assert version_of(await client.post("/v1/models/lstm/act", json={"observation": OBS, "session_id": "old"})) == "1"
    assert version_of(await client.post("/v1/models/lstm/act", json={"observation": OBS, "session_id": "new",
                                                                      "episode_start": True})) == "2"
    assert version_of(await client.post("/v1/models/lstm/act", json={"observation": OBS})) == "2"
    assert version_of(await client.post("/v1/models/lstm/versions/1/act", json={"observation": OBS})) == "1"
    # A session cannot be served by a version it is not bound to.
    r = await client.post("/v1/models/lstm/versions/2/act", json={"observation": OBS, "session_id": "old"})
    assert r.status_code == 409 and error_of(r)["code"] == "session_conflict"
    r = await client.post("/v1/models/lstm/act", json={"observations": [OBS, OBS], "session_ids": ["old", "new"]})
    assert r.status_code == 409
    meta = (await client.get("/v1/models/lstm")).json()
    assert meta["current_version"] == "2" and meta["versions"] == ["1", "2"]

    # Unloading version 1 ends its sessions (410) and leaves version 2 serving.
    r = await client.delete("/v1/admin/models/lstm/versions/1", headers=AUTH)
    assert r.status_code == 200 and r.json()["versions"] == ["1"]
    r = await client.post("/v1/models/lstm/act", json={"observation": OBS, "session_id": "old"})
    assert r.status_code == 410 and "unloaded" in error_of(r)["message"]
    assert version_of(await client.post("/v1/models/lstm/act", json={"observation": OBS, "session_id": "new"})) == "2"

    assert (await client.delete("/v1/admin/models/lstm", headers=AUTH)).status_code == 200
    r = await client.post("/v1/models/lstm/act", json={"observation": OBS})
    assert r.status_code == 404 and error_of(r)["code"] == "model_not_found"


async def test_failed_load_leaves_the_serving_version(make_client):
    app, client = make_client(("mlp",), admin_token=TOKEN)
    repo = app.state.repository
    broken = svc_bundles.copy_as_version(repo / "mlp", repo / "mlp_broken", "2")
    with open(broken / "model.onnx", "r+b") as fh:  # flip bytes: the checksum no longer matches
        fh.seek(100)
        fh.write(b"\x00\x01\x02\x03")
    r = await client.post("/v1/admin/models", json={"path": "mlp_broken"}, headers=AUTH)
    assert r.status_code == 422 and error_of(r)["code"] == "bundle_invalid" and "sha256" in error_of(r)["message"]
    r = await client.post("/v1/models/mlp/act", json={"observation": OBS})
    assert r.status_code == 200 and r.json()["version"] == "1"
    # Loading a version that is already loaded is a conflict, not a replacement.
    r = await client.post("/v1/admin/models", json={"path": "mlp"}, headers=AUTH)
    assert r.status_code == 409 and error_of(r)["code"] == "version_conflict"


async def test_paths_must_stay_inside_the_repository(make_client, tmp_path):
    app, client = make_client(("mlp",), admin_token=TOKEN)
    repo = app.state.repository
    outside = tmp_path / "outside"
    svc_bundles.copy_as_version(repo / "mlp", outside, "9")
    os.symlink(outside, repo / "sneaky")
    for path in ("../outside", str(outside), "sneaky", "mlp/../../outside"):
        r = await client.post("/v1/admin/models", json={"path": path}, headers=AUTH)
        assert r.status_code == 400, path
        assert error_of(r)["code"] == "path_outside_repository" and error_of(r)["field"] == "path"
    r = await client.post("/v1/admin/models", json={"path": "does-not-exist"}, headers=AUTH)
    assert r.status_code == 422


async def test_upload_an_archive(make_client, tmp_path):
    app, client = make_client(("mlp",), admin_token=TOKEN)
    v3 = svc_bundles.copy_as_version(app.state.repository / "mlp", tmp_path / "v3", "3")
    archive = pack_bundle(v3, tmp_path / "mlp-3.rlsb")
    r = await client.post("/v1/admin/models", content=archive.read_bytes(),
                          headers={**AUTH, "Content-Type": "application/octet-stream"})
    assert r.status_code == 201 and r.json()["version"] == "3"
    assert (await client.post("/v1/models/mlp/act", json={"observation": OBS})).json()["version"] == "3"
    r = await client.post("/v1/admin/models", content=b"not a tarball",
                          headers={**AUTH, "Content-Type": "application/octet-stream"})
    assert r.status_code == 422 and error_of(r)["code"] == "bundle_invalid"
    r = await client.post("/v1/admin/models", content=b"x", headers={**AUTH, "Content-Type": "text/plain"})
    assert r.status_code == 400 and error_of(r)["field"] == "Content-Type"


async def test_admin_metadata_shows_state_layout(make_client):
    _, client = make_client(("gtrxl",), admin_token=TOKEN)
    meta = (await client.get("/v1/admin/models/gtrxl/versions/1", headers=AUTH)).json()
    assert meta["state"] == [{"name": "memory_0", "shape": [3, 8], "dtype": "float32", "initial_value": 0.0}]
    assert meta["prev"] == {"n_prev_actions": 2, "n_prev_rewards": 2, "action_width": 1}
    assert "model.onnx" in meta["files"] and meta["runtime"]["kind"] == "onnx"
    assert meta["observation_space"]["type"] == "Box" and json.dumps(meta)
