"""Hostile bundles through the admin API: each is refused with 422 ``bundle_invalid`` naming
what is wrong, and whatever was serving keeps serving.

Every bundle here is a real, re-checksummed copy of the ``mlp`` bundle (ONNX and
TorchScript, ``Discrete(3)``, 4 observation columns) with one thing wrong, loaded through
real ONNX Runtime and TorchScript. Before the fixes such bundles answered 500, or loaded
under a name no route could reach again, or loaded and failed every request with 500
``batch_failed``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import error_of

from rlserve.models.export.archive import pack_bundle
from rlserve.models.export.bundle import MANIFEST_NAME, write_manifest

pytestmark = pytest.mark.asyncio

OBS = [0.1, -0.2, 0.3, 0.05]
TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
OCTET = {**AUTH, "Content-Type": "application/octet-stream"}


def variant(repo: Path, tag: str, edit=None, files: dict[str, bytes] | None = None) -> Path:
    """A copy of ``repo/mlp`` as ``repo/tag`` (version 2), with ``files`` replaced and the
    manifest edited by ``edit``, checksums and digest written again: only the change is wrong."""
    out = repo / tag
    shutil.copytree(repo / "mlp", out)
    for name, content in (files or {}).items():
        (out / name).write_bytes(content)
    data = json.loads((out / MANIFEST_NAME).read_text())
    data["version"] = "2"
    if edit is not None:
        edit(data)
    write_manifest(out, data, list(data["files"]))
    return out


async def still_serving(client) -> None:
    """Only ``mlp`` version 1 is loaded, and it answers."""
    listed = (await client.get("/v1/admin/models", headers=AUTH)).json()["models"]
    assert [(m["name"], m["version"]) for m in listed] == [("mlp", "1")]
    r = await client.post("/v1/models/mlp/act", json={"observation": OBS})
    assert r.status_code == 200 and r.json()["version"] == "1", r.text


@pytest.mark.parametrize("runtime, file, content", [
    ("onnx", "model.onnx", b"not an onnx file"),  # ONNX Runtime: InvalidProtobuf
    ("onnx", "model.onnx", b""),  # ONNX Runtime: InvalidArgument (no graph)
    ("torchscript", "model.ts", b"not a torchscript archive"),
])
async def test_a_model_file_that_is_no_model_is_refused(make_client, tmp_path, runtime, file, content):
    app, client = make_client(("mlp",), admin_token=TOKEN, runtime=runtime)
    broken = variant(app.state.repository, "broken", files={file: content})
    r = await client.post("/v1/admin/models", json={"path": "broken"}, headers=AUTH)
    error = error_of(r)
    assert r.status_code == 422 and error["code"] == "bundle_invalid", r.text
    assert error["field"] == "path" and error["received"] == "broken"
    assert file in error["message"] and str(broken) not in error["message"]
    r = await client.post("/v1/admin/models", content=pack_bundle(broken, tmp_path / "b.rlsb").read_bytes(),
                          headers=OCTET)
    assert r.status_code == 422 and error_of(r)["field"] == "body" and file in error_of(r)["message"], r.text
    await still_serving(client)
