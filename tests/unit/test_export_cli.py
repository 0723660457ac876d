"""``rlserve export`` / ``rlserve inspect`` through the real dispatcher (rlserve.service.cli.main).

Cases are picked by content (kind, presence of weights, smallest weight file), never by
name. The exported bundle must reproduce the fixture's recorded outputs in ONNX Runtime.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from oracle import OracleCase, case_dir, case_names, load_case, oracle_dirs_text, read_meta

from rlserve.models.export.bundle import MANIFEST_NAME, load_bundle, verify_reference
from rlserve.models.filters import MeanStdFilter
from rlserve.service.cli import main as rlserve


def _smallest_case(kinds: tuple[str, ...]) -> OracleCase:
    candidates = []
    for name in case_names():
        path = case_dir(name)
        if (path / "weights.npz").is_file() and read_meta(name)["kind"] in kinds:
            candidates.append(((path / "weights.npz").stat().st_size, name))
    if not candidates:
        pytest.fail(f"no oracle case of kind {kinds} with weights in {oracle_dirs_text()}")
    return load_case(min(candidates)[1])


def _ort(bundle_root: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(bundle_root / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feed), strict=True))


def _write_json(path: Path, value) -> Path:
    path.write_text(json.dumps(value))
    return path


@pytest.fixture(scope="module")
def feedforward_case() -> OracleCase:
    return _smallest_case(("feedforward",))


def test_export_from_separate_files_reproduces_the_fixture(
    feedforward_case: OracleCase, tmp_path: Path, capsys
) -> None:
    case = feedforward_case
    args = [
        "export",
        "--obs-space", str(_write_json(tmp_path / "obs.json", case.meta["observation_space"])),
        "--action-space", str(_write_json(tmp_path / "act.json", case.meta["action_space"])),
        "--config", str(_write_json(tmp_path / "model.json", case.meta["model_config_overrides"])),
        "--weights", str(case.path / "weights.npz"),
        "--out", str(tmp_path / "policy"), "--archive", "--formats", "onnx", "--version", "7",
    ]
    assert rlserve(args) == 0
    err = capsys.readouterr().err
    assert "exporting onnx" in err and "\r" not in err  # plain progress lines off a TTY
    for source in (tmp_path / "policy", tmp_path / "policy.rlsb"):
        bundle = load_bundle(source)
        assert (bundle.manifest.name, bundle.manifest.version) == ("policy", "7")
        assert set(bundle.manifest.runtimes) == {"onnx"}
        assert bundle.manifest.data["observation_space"] == case.meta["observation_space"]
    out = _ort(tmp_path / "policy", {"obs": case.io["obs_flat"].astype(np.float32)})
    np.testing.assert_allclose(out["dist_inputs"], case.io["model_out"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["value"], case.io["value"], rtol=1e-5, atol=1e-5)


def test_export_from_a_case_spec_then_inspect(tmp_path: Path, capsys) -> None:
    case = _smallest_case(("lstm", "attention"))
    out_dir = tmp_path / "rnn"
    assert rlserve(["export", "--spec", str(case.path / "case.json"), "--weights", str(case.path / "weights.npz"),
                    "--out", str(out_dir), "--name", "rnn-policy", "--deterministic", "--quiet"]) == 0
    assert capsys.readouterr().err == ""  # --quiet
    bundle = load_bundle(out_dir)
    assert bundle.manifest.explore is False and bundle.manifest.signature.is_recurrent
    assert bundle.manifest.preprocessor["class"] == case.meta["preprocessor"]["class"]
    assert bundle.manifest.action_dist["class"] == case.meta["action_dist"]["class"]
    verify_reference(bundle, lambda feed: _ort(out_dir, feed))

    assert rlserve(["inspect", str(out_dir)]) == 0
    text = capsys.readouterr().out
    assert "rnn-policy" in text and "all sha256 checksums verified" in text
    assert repr(bundle.manifest.observation_space) in text and repr(bundle.manifest.action_space) in text
    for name, entry in bundle.manifest.files.items():
        assert f"{name}" in text and entry["sha256"] in text
    changed = [k for k, v in case.meta["model_config_overrides"].items() if not isinstance(v, dict | list)]
    assert all(f"{k} = {json.dumps(case.meta['model_config_overrides'][k])}" in text for k in changed)
    assert "state_in_0" in text and "torch_version" in text

    assert rlserve(["inspect", "--json", str(out_dir)]) == 0
    assert json.loads(capsys.readouterr().out) == bundle.manifest.data


def test_export_with_a_frozen_filter(feedforward_case: OracleCase, tmp_path: Path, capsys) -> None:
    case = feedforward_case
    width = case.io["obs_flat"].shape[1:]
    filt = MeanStdFilter(width)
    for row in np.random.default_rng(0).normal(size=(10, *width)):
        filt.push(row)
    spec = _write_json(tmp_path / "case.json", case.meta)
    args = ["export", "--spec", str(spec), "--weights", str(case.path / "weights.npz"), "--formats", "onnx",
            "--filter", str(_write_json(tmp_path / "filter.json", filt.state_dict())), "--out", str(tmp_path / "b")]
    assert rlserve(args) == 0
    assert load_bundle(tmp_path / "b").manifest.filter == filt.state_dict()

    wrong = MeanStdFilter((width[0] + 1,))
    args[-3], args[-1] = str(_write_json(tmp_path / "wrong.json", wrong.state_dict())), str(tmp_path / "c")
    assert rlserve(args) == 2
    assert "filter's shape" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def _other_weights(case: OracleCase) -> Path:
    """A weights file of a case whose weights do not fit ``case``'s model (by shapes)."""
    for name in case_names():
        other = case_dir(name) / "weights.npz"
        if other.is_file() and name != case.name:
            with np.load(other) as z:
                if {k: z[k].shape for k in z.files} != {k: v.shape for k, v in case.weights.items()}:
                    return other
    pytest.fail("need a second case with different weights")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda a, t, c: a.__setitem__(a.index("--weights") + 1, str(t / "missing.npz")), "does not exist"),
        (lambda a, t, c: a.__setitem__(a.index("--spec") + 1, str(_text(t / "bad.json", "{nope"))), "not valid JSON"),
        (lambda a, t, c: a.__setitem__(a.index("--spec") + 1, str(_write_json(
            t / "s.json", {**c.meta, "action_space": {"type": "Discrete", "n": 0}}))), "action_space"),
        (lambda a, t, c: a.__setitem__(a.index("--spec") + 1, str(_write_json(
            t / "s.json", {**c.meta, "model_config": {"fcnet_hidens": [4]}}))), "fcnet_hidens"),
        (lambda a, t, c: a.extend(["--obs-space", "x.json"]), "either --spec or"),
        (lambda a, t, c: a.__setitem__(a.index("--weights") + 1, str(_other_weights(c))), "--weights"),
        (lambda a, t, c: _text(Path(a[a.index("--out") + 1]) / "keep.txt", "x"), "pass --force"),
        (lambda a, t, c: a.extend(["--formats", "onnx,tflite"]), "formats"),
    ],
)
def test_bad_input_exits_2_with_a_message(
    feedforward_case: OracleCase, tmp_path: Path, capsys, mutate, message
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    args = ["export", "--spec", str(feedforward_case.path / "case.json"),
            "--weights", str(feedforward_case.path / "weights.npz"), "--out", str(out), "--quiet"]
    mutate(args, tmp_path, feedforward_case)
    assert rlserve(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlserve export: error:") and message in err, err
    assert len(err.strip().splitlines()) == 1  # one clear line, no traceback


def _text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_inspect_refuses_a_tampered_bundle(feedforward_case: OracleCase, tmp_path: Path, capsys) -> None:
    case = feedforward_case
    assert rlserve(["export", "--spec", str(case.path / "case.json"), "--weights", str(case.path / "weights.npz"),
                    "--out", str(tmp_path / "b"), "--formats", "onnx", "--quiet"]) == 0
    manifest = tmp_path / "b" / MANIFEST_NAME
    manifest.write_text(manifest.read_text().replace('"explore": true', '"explore": false'))
    assert rlserve(["inspect", str(tmp_path / "b")]) == 2
    assert "manifest_sha256 does not match" in capsys.readouterr().err
    assert rlserve(["inspect", "--no-verify", str(tmp_path / "b")]) == 0
    assert "NOT verified" in capsys.readouterr().out


def test_a_runtime_disagreeing_with_eager_exits_1_and_writes_nothing(
    feedforward_case: OracleCase, tmp_path: Path, capsys, monkeypatch
) -> None:
    import rlserve.models.export.exporter as exporter

    monkeypatch.setattr(exporter, "ATOL", -1.0)  # no difference can pass
    case = feedforward_case
    args = ["export", "--spec", str(case.path / "case.json"), "--weights", str(case.path / "weights.npz"),
            "--out", str(tmp_path / "b"), "--formats", "onnx", "--quiet"]
    assert rlserve(args) == 1
    err = capsys.readouterr().err
    assert "export failed: BundleError" in err and "disagrees" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == []
