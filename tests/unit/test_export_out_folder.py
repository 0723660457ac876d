"""``rlserve export --out`` over an earlier export: refused with the way out, or replaced with
``--force``, never over a folder that is not an rlserve export (a typo must not delete files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from oracle import OracleCase, case_dir, case_names, load_case, read_meta

from rlserve.models.export.bundle import load_bundle
from rlserve.models.export.out_folder import is_export
from rlserve.service.cli import main as rlserve


@pytest.fixture(scope="module")
def case() -> OracleCase:
    sizes = [((case_dir(n) / "weights.npz").stat().st_size, n) for n in case_names()
             if (case_dir(n) / "weights.npz").is_file() and read_meta(n)["kind"] == "feedforward"]
    assert sizes, "needs a feedforward oracle case with weights"
    return load_case(min(sizes)[1])


def _export(case: OracleCase, out: Path, *extra: str) -> list[str]:
    return ["export", "--spec", str(case.path / "case.json"), "--weights", str(case.path / "weights.npz"),
            "--out", str(out), "--formats", "onnx", "--quiet", *extra]


def _one_line(err: str) -> str:
    assert err.startswith("rlserve export: error:") and len(err.strip().splitlines()) == 1, err
    return err


def test_a_second_export_to_the_same_folder_says_how_to_go_on(case: OracleCase, tmp_path: Path, capsys) -> None:
    out = tmp_path / "rps"
    assert rlserve(_export(case, out, "--version", "1")) == 0
    capsys.readouterr()
    assert rlserve(_export(case, out, "--version", "2")) == 2
    err = _one_line(capsys.readouterr().err)
    assert "--force" in err and "another --out" in err
    assert load_bundle(out).manifest.version == "1"


def test_force_replaces_an_earlier_export(case: OracleCase, tmp_path: Path) -> None:
    out = tmp_path / "my-module"
    assert rlserve(_export(case, out, "--version", "1", "--archive")) == 0
    assert rlserve(_export(case, out, "--version", "2", "--archive", "--force")) == 0
    assert load_bundle(out).manifest.version == "2"
    assert load_bundle(tmp_path / "my-module.rlsb").manifest.version == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my-module", "my-module.rlsb"]  # nothing left aside
    assert rlserve(_export(case, tmp_path / "new", "--force")) == 0  # nothing there yet: --force is harmless


def test_force_never_replaces_a_folder_that_is_not_an_export(case: OracleCase, tmp_path: Path, capsys) -> None:
    out = tmp_path / "src"
    (out / "app").mkdir(parents=True)
    (out / "app" / "main.py").write_text("print('mine')\n")
    (out / "manifest.json").write_text('{"name": "a web app"}')  # a manifest, but not a bundle's
    assert rlserve(_export(case, out, "--force")) == 2
    err = _one_line(capsys.readouterr().err)
    assert "not an rlserve export" in err and "another --out" in err
    assert (out / "app" / "main.py").read_text() == "print('mine')\n"


def test_a_failed_forced_export_keeps_the_earlier_one(case: OracleCase, tmp_path: Path, capsys) -> None:
    out = tmp_path / "policy"
    assert rlserve(_export(case, out, "--version", "1")) == 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**case.meta, "model_config": {"fcnet_hidens": [4]}}))
    args = _export(case, out, "--version", "2", "--force")
    args[args.index("--spec") + 1] = str(bad)
    assert rlserve(args) == 2
    assert "fcnet_hidens" in _one_line(capsys.readouterr().err)
    assert load_bundle(out).manifest.version == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "policy"]


def test_exports_are_told_by_their_manifests_format(tmp_path: Path) -> None:
    for name, text, expected in [
        ("policy_set.json", '{"format": "rlserve-policy-set"}', True),
        ("manifest.json", '{"format": "rlserve-bundle"}', True),
        ("manifest.json", '{"format": "something else"}', False),
        ("manifest.json", "not json", False),
        ("notes.txt", "hello", False),
    ]:
        folder = tmp_path / f"{name}-{expected}-{len(text)}"
        folder.mkdir()
        (folder / name).write_text(text)
        assert is_export(folder) is expected, (name, text)
