"""The pruned policy graph: a second ONNX graph without the value head, written and
verified at export, checked again at load, run for batches nobody asked the value of;
bundles written before it existed still load and serve."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from rlserve.models.export.bundle import MANIFEST_NAME, load_bundle, write_manifest
from rlserve.service.errors import BundleInvalid
from rlserve.service.serving.loading import load_policy
from rlserve.service.settings import Settings

OBS = [0.1, -0.2, 0.3, 0.05]


def _graph(path: Path) -> onnx.GraphProto:
    return onnx.load(str(path)).graph


@pytest.mark.parametrize("name", ["mlp", "vf_tower", "lstm"])
def test_export_writes_a_verified_graph_without_the_value_head(bundle_store, name):
    bundle = load_bundle(bundle_store / name)
    info = bundle.manifest.runtimes["onnx"].info
    assert info["policy_file"] == "model_policy.onnx" and "model_policy.onnx" in bundle.manifest.files
    full, policy = _graph(bundle.runtime_path("onnx")), _graph(bundle.policy_path("onnx"))
    assert [i.name for i in policy.input] == [i.name for i in full.input]
    assert [o.name for o in policy.output] == [o.name for o in full.output if o.name != "value"]
    assert len(policy.node) < len(full.node)


def test_a_separate_value_tower_is_gone_from_the_policy_graph(bundle_store):
    bundle = load_bundle(bundle_store / "vf_tower")
    full = _graph(bundle.runtime_path("onnx"))
    policy = _graph(bundle.policy_path("onnx"))
    value_weights = [i.name for i in full.initializer if "value" in i.name]
    assert value_weights and not [i.name for i in policy.initializer if "value" in i.name]
    # the value tower is a whole MLP: its matrix multiplications are gone too
    gemms = [n for n in full.node if n.op_type in ("Gemm", "MatMul")]
    assert len([n for n in policy.node if n.op_type in ("Gemm", "MatMul")]) <= len(gemms) - 3


def test_policy_graph_serves_the_same_actions_and_logp(bundle_store):
    policy = load_policy(bundle_store / "vf_tower", Settings())
    obs = np.random.default_rng(0).uniform(-1, 1, (5, 4)).astype(np.float32)
    full, pruned = policy.runtime.run({"obs": obs}), policy.runtime.run({"obs": obs}, value=False)
    assert "value" in full and "value" not in pruned
    np.testing.assert_array_equal(pruned["dist_inputs"], full["dist_inputs"])
    assert policy.runtime.describe()["policy_graph"] is True


@pytest.mark.asyncio
async def test_value_is_computed_only_when_a_request_asks(make_client):
    app, client = make_client(("vf_tower",))
    runtime = app.state.registry.entry("vf_tower").policy().runtime
    calls = []
    real_run = runtime.run

    def spy(inputs, **options):
        calls.append(options.get("value", True))
        return real_run(inputs, **options)

    runtime.run = spy
    plain = await client.post("/v1/models/vf_tower/act", json={"observation": OBS, "explore": False})
    valued = await client.post("/v1/models/vf_tower/act",
                               json={"observation": OBS, "explore": False, "outputs": ["value"]})
    assert plain.status_code == valued.status_code == 200
    assert calls == [False, True]
    assert "value" not in plain.json() and isinstance(valued.json()["value"], float)
    assert plain.json()["action"] == valued.json()["action"]
    assert plain.json()["logp"] == pytest.approx(valued.json()["logp"], abs=1e-6)


def _without_policy_graph(src: Path, dst: Path) -> Path:
    """The bundle as exporters before the policy graph wrote it."""
    shutil.copytree(src, dst)
    data = json.loads((dst / MANIFEST_NAME).read_text())
    del data["runtimes"]["onnx"]["policy_file"]
    (dst / "model_policy.onnx").unlink()
    write_manifest(dst, data, [f for f in data["files"] if f != "model_policy.onnx"])
    return dst


@pytest.mark.asyncio
async def test_bundles_written_before_the_policy_graph_still_serve(tmp_path, bundle_store, make_client):
    repo = tmp_path / "old"
    repo.mkdir()
    _without_policy_graph(bundle_store / "vf_tower", repo / "vf_tower")
    app, client = make_client(("vf_tower",), repository=repo)
    assert app.state.registry.entry("vf_tower").policy().runtime.describe()["policy_graph"] is False
    plain = await client.post("/v1/models/vf_tower/act", json={"observation": OBS, "explore": False})
    valued = await client.post("/v1/models/vf_tower/act",
                               json={"observation": OBS, "explore": False, "outputs": ["value"]})
    assert plain.status_code == valued.status_code == 200
    assert plain.json()["action"] == valued.json()["action"] and "value" in valued.json()


def test_a_policy_graph_that_disagrees_is_refused_at_load(tmp_path, bundle_store):
    """Checksums re-written over a policy graph with a wrong weight: the reference check
    at load runs the policy graph too, and refuses the bundle."""
    dst = tmp_path / "vf_tower"
    shutil.copytree(bundle_store / "vf_tower", dst)
    model = onnx.load(str(dst / "model_policy.onnx"))
    weight = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    arr = numpy_helper.to_array(weight).copy()
    arr.flat[0] += 1.0
    weight.CopyFrom(numpy_helper.from_array(arr, weight.name))
    onnx.save(model, str(dst / "model_policy.onnx"))
    data = json.loads((dst / MANIFEST_NAME).read_text())
    write_manifest(dst, data, list(data["files"]))
    with pytest.raises(BundleInvalid, match="dist_inputs"):
        load_policy(dst, Settings())
