"""Bundle loading refuses what it must (tampering, unsafe archives) and round-trips archives.

Torch-free on purpose, like the code under test: the bundle here holds a tiny ONNX graph
built with ``onnx.helper`` (dist_inputs = obs @ W, value = sum(obs)) and its reference.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from rlserve.models.export.bundle import (
    MANIFEST_NAME,
    Bundle,
    BundleError,
    load_bundle,
    manifest_digest,
    pack_bundle,
    unpack_bundle,
    verify_reference,
    write_manifest,
)

REPO = Path(__file__).resolve().parents[2]
W = np.arange(8, dtype=np.float32).reshape(4, 2) / 7.0


def _onnx_model(path: Path) -> None:
    obs = helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])
    logits = helper.make_tensor_value_info("dist_inputs", TensorProto.FLOAT, ["batch", 2])
    value = helper.make_tensor_value_info("value", TensorProto.FLOAT, ["batch"])
    nodes = [
        helper.make_node("MatMul", ["obs", "W"], ["dist_inputs"]),
        helper.make_node("ReduceSum", ["obs", "axes"], ["value"], keepdims=0),
    ]
    init = [numpy_helper.from_array(W, "W"), numpy_helper.from_array(np.array([1], np.int64), "axes")]
    graph = helper.make_graph(nodes, "toy", [obs], [logits, value], init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save(model, str(path))


def _manifest_body() -> dict:
    return {
        "format": "rlserve-bundle",
        "format_version": 1,
        "name": "toy",
        "version": "3",
        "created_at": "2024-01-01T00:00:00+00:00",
        "observation_space": {"type": "Box", "low": -1.0, "high": 1.0, "shape": [4], "dtype": "float32"},
        "action_space": {"type": "Discrete", "n": 2, "start": 0},
        "model_config": {"fcnet_hiddens": [8]},
        "action_dist": {"name": "TorchCategorical"},
        "num_outputs": 2,
        "preprocessor": {"class": "NoPreprocessor", "output_shape": [4]},
        "filter": None,
        "signature": {
            "obs_shape": [4], "num_outputs": 2, "state": [],
            "prev": {"n_prev_actions": 0, "n_prev_rewards": 0, "action_width": 0, "windowed": False},
            "input_names": ["obs"], "output_names": ["dist_inputs", "value"],
        },
        "runtimes": {"onnx": {"file": "model.onnx", "opset": 18}},
        "reference": {"file": "reference.npz", "rtol": 1e-5, "atol": 1e-6},
        "explore": True,
    }


def _write_reference(root: Path, obs: np.ndarray, logits: np.ndarray, value: np.ndarray) -> None:
    np.savez(root / "reference.npz", **{"inputs/obs": obs, "outputs/dist_inputs": logits, "outputs/value": value})


@pytest.fixture
def bundle_dir(tmp_path: Path) -> Path:
    root = tmp_path / "bundle"
    root.mkdir()
    _onnx_model(root / "model.onnx")
    obs = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    _write_reference(root, obs, obs @ W, obs.sum(axis=1))
    write_manifest(root, _manifest_body(), ["model.onnx", "reference.npz"])
    return root


def _ort_run(bundle: Bundle):
    session = ort.InferenceSession(str(bundle.runtime_path("onnx")), providers=["CPUExecutionProvider"])
    return lambda inputs: dict(zip(["dist_inputs", "value"], session.run(None, inputs), strict=True))


def _rewrite_manifest(root: Path, change) -> None:
    data = json.loads((root / MANIFEST_NAME).read_text())
    change(data)
    (root / MANIFEST_NAME).write_text(json.dumps(data))


# --------------------------------------------------------------------------- loading

def test_a_good_bundle_loads_and_matches_its_reference(bundle_dir: Path) -> None:
    bundle = load_bundle(bundle_dir)
    m = bundle.manifest
    assert (m.name, m.version, m.num_outputs, m.explore) == ("toy", "3", 2, True)
    assert m.signature.input_names == ["obs"] and m.output_names == ["dist_inputs", "value"]
    assert m.observation_space.shape == (4,) and m.action_space.n == 2
    assert set(m.files) == {"model.onnx", "reference.npz"}
    diffs = verify_reference(bundle, _ort_run(bundle))
    assert set(diffs) == {"dist_inputs", "value"} and max(diffs.values()) < 1e-5


def test_changed_weights_file_is_refused(bundle_dir: Path) -> None:
    model = onnx.load(str(bundle_dir / "model.onnx"))
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(W * 2, "W"))
    onnx.save(model, str(bundle_dir / "model.onnx"))
    with pytest.raises(BundleError, match=r"model\.onnx.*sha256.*modified"):
        load_bundle(bundle_dir)
    # Opting out of checksums loads it, and the reference check then catches the change.
    bundle = load_bundle(bundle_dir, verify_checksums=False)
    with pytest.raises(BundleError, match="'dist_inputs' disagrees"):
        verify_reference(bundle, _ort_run(bundle))


def test_changed_manifest_is_refused(bundle_dir: Path) -> None:
    _rewrite_manifest(bundle_dir, lambda d: d.update(explore=False))
    with pytest.raises(BundleError, match="manifest_sha256 does not match"):
        load_bundle(bundle_dir)


def test_reformatted_manifest_still_loads(bundle_dir: Path) -> None:
    _rewrite_manifest(bundle_dir, lambda d: None)  # compact JSON, same content
    assert load_bundle(bundle_dir).manifest.name == "toy"


def test_a_manifest_and_files_rewritten_consistently_still_fail_the_reference(bundle_dir: Path) -> None:
    obs = np.ones((3, 4), np.float32)
    logits = obs @ W
    logits[1, 0] += 0.5  # a wrong expected output
    _write_reference(bundle_dir, obs, logits, obs.sum(axis=1))
    data = json.loads((bundle_dir / MANIFEST_NAME).read_text())
    write_manifest(bundle_dir, {k: v for k, v in data.items() if k != "files"}, ["model.onnx", "reference.npz"])
    bundle = load_bundle(bundle_dir)  # checksums are consistent ...
    with pytest.raises(BundleError, match=r"'dist_inputs' disagrees.*max \|diff\| 0\.5.*index \(1, 0\)"):
        verify_reference(bundle, _ort_run(bundle))  # ... but the numbers are not


def test_runtime_missing_an_output_is_named(bundle_dir: Path) -> None:
    bundle = load_bundle(bundle_dir)
    with pytest.raises(BundleError, match="no output 'value'"):
        verify_reference(bundle, lambda inputs: {"dist_inputs": inputs["obs"] @ W})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(format_version=2), "format_version 2 is not supported"),
        (lambda d: d.pop("signature"), "missing required field 'signature'"),
        (lambda d: d["files"].update({"../evil": d["files"]["model.onnx"]}), "not a plain file name"),
        (lambda d: d["runtimes"]["onnx"].update(file="other.onnx"), "not among the checksummed files"),
        (lambda d: d["signature"].update(input_names=["x"]), "signature.input_names"),
        (lambda d: d.update(num_outputs=True), "'num_outputs' should be int"),
    ],
)
def test_structurally_bad_manifests_are_refused(bundle_dir: Path, change, message: str) -> None:
    data = json.loads((bundle_dir / MANIFEST_NAME).read_text())
    change(data)
    data["manifest_sha256"] = manifest_digest(data)  # consistent digest: the structure is what fails
    (bundle_dir / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(BundleError, match=message):
        load_bundle(bundle_dir)


@pytest.mark.parametrize("key", ["version", "name"])
def test_a_manifest_string_with_a_lone_surrogate_is_refused(bundle_dir: Path, key: str) -> None:
    # The version and name reach Parquet (the experience log), which cannot hold "\ud800";
    # such a manifest with a consistent digest used to load.
    data = json.loads((bundle_dir / MANIFEST_NAME).read_text())
    data[key] = "v\ud800"
    data["manifest_sha256"] = manifest_digest(data)
    (bundle_dir / MANIFEST_NAME).write_text(json.dumps(data))  # ASCII: the escape, as a client sends it
    with pytest.raises(BundleError, match=r"manifest.json: a string holds a lone surrogate escape"):
        load_bundle(bundle_dir)


def test_missing_listed_file_is_refused(bundle_dir: Path) -> None:
    (bundle_dir / "reference.npz").unlink()
    with pytest.raises(BundleError, match="'reference.npz' is missing"):
        load_bundle(bundle_dir)


def test_reference_is_loaded_without_unpickling(bundle_dir: Path) -> None:
    np.savez(bundle_dir / "reference.npz", **{"inputs/obs": np.array([{"a": 1}], dtype=object)})
    data = json.loads((bundle_dir / MANIFEST_NAME).read_text())
    write_manifest(bundle_dir, {k: v for k, v in data.items() if k != "files"}, ["model.onnx", "reference.npz"])
    with pytest.raises(BundleError, match="unreadable reference file"):
        load_bundle(bundle_dir).reference()


def test_not_a_bundle(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="no manifest.json"):
        load_bundle(tmp_path)
    with pytest.raises(BundleError, match="does not exist"):
        load_bundle(tmp_path / "nope.rlsb")
    (tmp_path / "junk.rlsb").write_bytes(b"not an archive")
    with pytest.raises(BundleError, match="not a bundle archive"):
        load_bundle(tmp_path / "junk.rlsb")


# --------------------------------------------------------------------------- archives

def test_pack_unpack_round_trip_is_byte_identical_and_reproducible(bundle_dir: Path, tmp_path: Path) -> None:
    first = pack_bundle(bundle_dir, tmp_path / "a.rlsb")
    second = pack_bundle(bundle_dir, tmp_path / "b.rlsb")
    assert first.read_bytes() == second.read_bytes()
    out = unpack_bundle(first, tmp_path / "unpacked")
    for name in ("manifest.json", "model.onnx", "reference.npz"):
        assert (out / name).read_bytes() == (bundle_dir / name).read_bytes()
    loaded = load_bundle(first)
    assert loaded.root != bundle_dir and loaded.manifest.data == load_bundle(bundle_dir).manifest.data
    verify_reference(loaded, _ort_run(loaded))


def test_pack_refuses_a_tampered_bundle(bundle_dir: Path, tmp_path: Path) -> None:
    (bundle_dir / "model.onnx").write_bytes(b"x")
    with pytest.raises(BundleError, match="sha256"):
        pack_bundle(bundle_dir, tmp_path / "a.rlsb")
    assert not (tmp_path / "a.rlsb").exists()


def test_unpack_refuses_a_non_empty_destination(bundle_dir: Path, tmp_path: Path) -> None:
    archive = pack_bundle(bundle_dir, tmp_path / "a.rlsb")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "x").write_text("x")
    with pytest.raises(BundleError, match="not empty"):
        unpack_bundle(archive, dest)


def _tar_with(path: Path, *members: tuple[tarfile.TarInfo, bytes | None]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def _manifest(*names: str) -> tuple[tarfile.TarInfo, bytes]:
    """A manifest member listing ``names`` (each one byte b"x"), so the checks after it are reached."""
    x = {"sha256": "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881", "bytes": 1}
    return _file(MANIFEST_NAME, json.dumps({"files": {n: x for n in names}}).encode())


def _link(name: str, target: str, kind: bytes) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ([_file("../escape.txt")], r"escapes the bundle directory"),
        ([_file("./a/../../escape.txt")], r"escapes the bundle directory"),
        ([_file("/tmp/abs.txt")], r"absolute path"),
        ([_link("manifest.json", "/etc/passwd", tarfile.SYMTYPE)], r"is a link"),
        ([_manifest("a.txt", "b.txt"), _file("a.txt"), _link("b.txt", "a.txt", tarfile.LNKTYPE)], r"is a link"),
        ([_file("sub/manifest.json")], r"subdirectory"),
        ([_manifest("a.txt"), _file("a.txt"), _file("a.txt")], r"appears twice"),
        ([_manifest(), _manifest()], r"appears twice"),
        ([(tarfile.TarInfo("fifo"), None)], None),  # type filled in below
    ],
)
def test_unsafe_archive_members_are_refused_before_anything_is_written(
    tmp_path: Path, members, message: str | None
) -> None:
    if message is None:
        members[0][0].type = tarfile.FIFOTYPE
        message = "not a regular file"
    archive = _tar_with(tmp_path / "evil.rlsb", *members)
    dest = tmp_path / "deep" / "dest"
    with pytest.raises(BundleError, match=message):
        unpack_bundle(archive, dest)
    with pytest.raises(BundleError, match=message):
        load_bundle(archive)
    assert not dest.exists() or not any(dest.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.rlsb"]


def test_a_dot_root_entry_as_written_by_tar_dash_C_is_accepted(bundle_dir: Path, tmp_path: Path) -> None:
    archive = tmp_path / "manual.rlsb"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(bundle_dir, arcname=".")  # ./ , ./manifest.json, ...
    assert load_bundle(archive).manifest.name == "toy"


def test_preprocessor_rebuilt_by_the_server_must_match_the_recorded_one(bundle_dir: Path) -> None:
    from rlserve.models.export.describe import check_preprocessor
    from rlserve.models.preprocessors import get_preprocessor

    manifest = load_bundle(bundle_dir).manifest
    prep = get_preprocessor(manifest.observation_space, {"dim": 84, "grayscale": False, "zero_mean": True})
    recorded = {k: v for k, v in manifest.preprocessor.items() if k != "options"}
    check_preprocessor(recorded, prep)  # NoPreprocessor -> [4]
    with pytest.raises(BundleError, match=r"preprocessor.output_shape.*\[5\].*\[4\]"):
        check_preprocessor({**recorded, "output_shape": [5]}, prep)
    with pytest.raises(BundleError, match="preprocessor.class"):
        check_preprocessor({**recorded, "class": "OneHotPreprocessor"}, prep)


def test_bundle_module_does_not_import_torch() -> None:
    code = (
        "import sys, rlserve.models.export, rlserve.models.export.bundle, rlserve.models.export.describe, "
        "rlserve.models.export.report, "
        "rlserve.models.export.cli; assert 'torch' not in sys.modules, 'torch imported'"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
