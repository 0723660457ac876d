"""Hostile bundles through the admin API: each is refused with 422 ``bundle_invalid`` naming
what is wrong, and whatever was serving keeps serving.

Every bundle here is a real, re-checksummed copy of the ``mlp`` bundle (ONNX and
TorchScript, ``Discrete(3)``, 4 observation columns) with one thing wrong, loaded through
real ONNX Runtime and TorchScript. Before the fixes such bundles answered 500, or loaded
under a name no route could reach again, or loaded and failed every request with 500
``batch_failed``.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import svc_bundles
from bundle_edits import archive, edited_copy
from conftest import error_of

from rlserve.models.export.bundle import BundleError, pack_bundle
from rlserve.models.export.names import NAME_RULE
from rlserve.service.errors import BundleInvalid
from rlserve.service.serving.policy_sets import load_served_set
from rlserve.service.serving.registry import ModelRegistry
from rlserve.service.settings import Settings

pytestmark = pytest.mark.asyncio

OBS = [0.1, -0.2, 0.3, 0.05]
TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
OCTET = {**AUTH, "Content-Type": "application/octet-stream"}


def variant(repo: Path, tag: str, edit=None, files: dict[str, bytes] | None = None) -> Path:
    """A copy of ``repo/mlp`` as ``repo/tag`` (version 2), with ``files`` replaced and the
    manifest edited by ``edit``, checksums and digest written again: only the change is wrong."""
    return edited_copy(repo / "mlp", repo / tag, edit, files)


def npz(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


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


async def test_reference_rows_of_the_wrong_shape_are_refused(make_client):
    app, client = make_client(("mlp",), admin_token=TOKEN)
    repo = app.state.repository
    with np.load(repo / "mlp" / "reference.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays["inputs/obs"] = arrays["inputs/obs"][:, :2]
    variant(repo, "short_rows", files={"reference.npz": npz(arrays)})
    r = await client.post("/v1/admin/models", json={"path": "short_rows"}, headers=AUTH)
    message = error_of(r)["message"]
    assert r.status_code == 422 and "reference.npz" in message and "'obs'" in message and "[2]" in message, r.text
    await still_serving(client)


def _obs5(m: dict[str, Any]) -> None:
    m["observation_space"].update(shape=[5], low=[-1.0] * 5, high=[1.0] * 5)
    m["signature"]["obs_shape"] = [5]


def _num_outputs(n: int):
    def edit(m: dict[str, Any]) -> None:
        m["num_outputs"] = m["signature"]["num_outputs"] = n
    return edit


BOX = {"type": "Box", "low": [-1.0], "high": [1.0], "shape": [1], "dtype": "float32"}
MISMATCHES = {
    # (edit, words the refusal must hold)
    "obs_shape_5_for_a_graph_of_4": (_obs5, ["model.onnx", "'obs'", "[4]", "[5]"]),
    "discrete_4_for_3_outputs": (lambda m: m["action_space"].update(n=4), ["Discrete(4)", "needs 4", "is 3"]),
    "discrete_2_to_the_40": (lambda m: m["action_space"].update(n=2**40), ["needs 1099511627776"]),
    "negative_num_outputs": (_num_outputs(-1), ["num_outputs is -1"]),
    "box_action_on_a_categorical_model": (lambda m: m.update(action_space=BOX), ["TorchCategorical", "Box"]),
    "dist_width_7": (lambda m: m["action_dist"].update(num_outputs=7), ["'dist_inputs'", "[3]", "[7]"]),
}


@pytest.mark.parametrize("tag", list(MISMATCHES))
async def test_a_manifest_that_disagrees_with_its_model_is_refused_at_load(make_client, tag):
    edit, words = MISMATCHES[tag]
    app, client = make_client(("mlp",), admin_token=TOKEN)
    variant(app.state.repository, tag, edit=edit)
    r = await client.post("/v1/admin/models", json={"path": tag}, headers=AUTH)
    error = error_of(r)
    assert r.status_code == 422 and error["code"] == "bundle_invalid", r.text
    assert all(word in error["message"] for word in words), (words, error["message"])
    await still_serving(client)


async def test_every_kind_of_served_bundle_still_loads(make_client):
    """The consistency check refuses none of the real bundles: recurrent, attention with
    previous actions and rewards, masked Dict observations, images; TorchScript too."""
    names = ("mlp", "vf_tower", "lstm", "gtrxl", "masked", "image")
    _, client = make_client(names, admin_token=TOKEN)
    body = (await client.get("/v1/admin/models", headers=AUTH)).json()
    assert body["failed_to_load"] == {} and sorted(m["name"] for m in body["models"]) == sorted(names)
    _, client = make_client(("mlp",), admin_token=TOKEN, runtime="torchscript")
    assert (await client.post("/v1/models/mlp/act", json={"observation": OBS})).status_code == 200


BAD_NAMES = [("name", "a/b"), ("name", ""), ("name", "n" * 5000), ("name", "a\x00b"), ("name", "../../../x"),
             ("name", ".hidden"), ("name", "a b"), ("name", "cartpole\n"), ("version", ""), ("version", "../.."),
             ("version", "1/2")]


@pytest.mark.parametrize("field, value", BAD_NAMES, ids=[f"{f}-{v!r:.20}" for f, v in BAD_NAMES])
async def test_a_name_or_version_no_route_can_reach_is_refused(make_client, tmp_path, field, value):
    app, client = make_client(("mlp",), admin_token=TOKEN)
    hostile = variant(app.state.repository, "hostile", edit=lambda m: m.update({field: value}))
    r = await client.post("/v1/admin/models", content=archive(hostile), headers=OCTET)
    error = error_of(r)
    assert r.status_code == 422 and error["code"] == "bundle_invalid", r.text
    assert error["field"] == field and error["expected"] == NAME_RULE
    if isinstance(value, str) and len(value) > 256:
        assert error["received"] == f"a string of {len(value)} characters"
    else:
        assert error["received"] == value
    r = await client.post("/v1/admin/models", json={"path": "hostile"}, headers=AUTH)
    assert r.status_code == 422 and error_of(r)["field"] == field, r.text
    await still_serving(client)


@pytest.mark.parametrize("name, version", [("team.p0", "1.0"), ("_x-y", "2025-01-01"), ("m" * 128, "v" * 128)])
async def test_names_within_the_rule_load_act_and_unload(make_client, tmp_path, name, version):
    app, client = make_client(("mlp",), admin_token=TOKEN)
    fine = variant(app.state.repository, "fine", edit=lambda m: m.update(name=name, version=version))
    r = await client.post("/v1/admin/models", content=pack_bundle(fine, tmp_path / "f.rlsb").read_bytes(),
                          headers=OCTET)
    assert r.status_code == 201 and r.json()["name"] == name, r.text
    r = await client.post(f"/v1/models/{name}/versions/{version}/act", json={"observation": OBS})
    assert r.status_code == 200, r.text
    r = await client.delete(f"/v1/admin/models/{name}/versions/{version}", headers=AUTH)
    assert r.status_code == 200 and r.json()["versions"] == [version]
    await still_serving(client)


async def test_a_checkpoint_directory_name_no_route_can_reach_is_refused(make_client, tmp_path):
    """A checkpoint is served under its directory's name: one no route can reach is refused
    before anything is exported (nothing is written to the export cache)."""
    app, client = make_client(("mlp",), admin_token=TOKEN, export_cache=tmp_path / "cache")
    (app.state.repository / "a ckpt").mkdir()
    (app.state.repository / "a ckpt" / "rllib_checkpoint.json").write_text("{}")
    r = await client.post("/v1/admin/models", json={"path": "a ckpt"}, headers=AUTH)
    error = error_of(r)
    assert r.status_code == 422 and error["field"] == "name" and error["received"] == "a ckpt", r.text
    assert error["expected"] == NAME_RULE and "NAME=DIR" in error["message"]
    assert not (tmp_path / "cache").exists()
    await still_serving(client)


async def test_a_broken_checkpoint_loaded_by_path_names_the_path(make_client, tmp_path):
    """docs/api.md: a path load that fails is 422 ``bundle_invalid`` with field ``path``."""
    app, client = make_client(("mlp",), admin_token=TOKEN, export_cache=tmp_path / "cache")
    broken = app.state.repository / "ckpt"
    broken.mkdir()
    (broken / "rllib_checkpoint.json").write_text("{not json")
    r = await client.post("/v1/admin/models", json={"path": "ckpt"}, headers=AUTH)
    error = error_of(r)
    assert r.status_code == 422 and error["code"] == "bundle_invalid" and error["field"] == "path", r.text
    assert error["received"] == "ckpt" and "RLlib checkpoint" in error["message"]
    await still_serving(client)


async def test_a_policy_set_name_no_route_can_reach_is_refused(tmp_path):
    with pytest.raises(BundleInvalid) as info:
        load_served_set(tmp_path, Settings(repository=tmp_path), name="..")
    assert info.value.field == "name" and info.value.received == ".." and info.value.expected == NAME_RULE


async def test_the_registry_refuses_a_name_it_could_not_route(make_client):
    """The registry's own check, behind the manifest's: a policy renamed after its bundle
    was loaded (as a policy set renames its members) cannot be registered unreachable."""
    app, _ = make_client(("mlp",), admin_token=TOKEN)
    registry: ModelRegistry = app.state.registry
    policy = registry.load_policy(variant(app.state.repository, "renamed"))
    policy.bundle.manifest.data["name"] = "set/p0"
    with pytest.raises(BundleInvalid) as info:
        registry.add(policy)
    assert info.value.field == "name" and "set/p0" not in registry.entries
    await policy.close()


@pytest.mark.parametrize("field, value", [("name", "team/p0"), ("version", "../..")])
async def test_the_exporter_refuses_such_a_name_before_it_writes(tmp_path, field, value):
    from rlserve.models.export.exporter import export_bundle

    spec = svc_bundles.SPECS["mlp"]
    out = tmp_path / "out"
    with pytest.raises(BundleError) as info:
        export_bundle(svc_bundles.build_model("mlp"), obs_space=spec["obs"], action_space=spec["act"],
                      model_config=spec["config"], out_dir=out, formats=["onnx"], **{field: value})
    assert info.value.field == field and info.value.received == value
    assert not out.exists() and list(tmp_path.iterdir()) == []
