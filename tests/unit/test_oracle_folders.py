"""RLSERVE_ORACLE_DIR: several case folders, explicit folders must exist, names are unique.

Built on made-up case folders (case.json only), so it checks the loader, not RLlib.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from oracle import ENV_VAR, OracleFolderError, all_case_names, case_dir, case_names, oracle_dirs, read_meta


def _case(root: Path, name: str, kind: str = "feedforward") -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "case.json").write_text(json.dumps({"kind": kind}))
    return path


def _use(monkeypatch: pytest.MonkeyPatch, *folders: Path) -> None:
    monkeypatch.setenv(ENV_VAR, os.pathsep.join(str(f) for f in folders))


def test_cases_of_several_folders_are_found_in_their_own_folder(tmp_path, monkeypatch) -> None:
    a, b = _case(tmp_path / "a", "one"), _case(tmp_path / "b", "two", kind="lstm")
    _use(monkeypatch, tmp_path / "a", tmp_path / "b")
    assert oracle_dirs() == ((tmp_path / "a").resolve(), (tmp_path / "b").resolve())
    assert all_case_names() == ["one", "two"]
    assert case_dir("one") == a.resolve() and case_dir("two") == b.resolve()


def test_a_merged_folder_lists_the_same_cases(tmp_path, monkeypatch) -> None:
    _case(tmp_path / "a", "one")
    _case(tmp_path / "b", "two")
    _case(tmp_path / "merged", "one")
    _case(tmp_path / "merged", "two")
    _use(monkeypatch, tmp_path / "a", tmp_path / "b")
    apart = all_case_names()
    _use(monkeypatch, tmp_path / "merged")
    assert all_case_names() == apart == ["one", "two"]


def test_a_case_name_in_two_folders_is_an_error(tmp_path, monkeypatch) -> None:
    _case(tmp_path / "a", "same")
    _case(tmp_path / "b", "same")
    _use(monkeypatch, tmp_path / "a", tmp_path / "b")
    with pytest.raises(OracleFolderError, match="'same' is in both"):
        all_case_names()


def test_a_named_folder_that_does_not_exist_is_an_error(tmp_path, monkeypatch) -> None:
    _case(tmp_path / "a", "one")
    _use(monkeypatch, tmp_path / "a", tmp_path / "missing")
    with pytest.raises(OracleFolderError, match="missing"):
        oracle_dirs()


def test_cases_of_unknown_kinds_are_listed_apart(tmp_path, monkeypatch) -> None:
    _case(tmp_path / "a", "known")
    _case(tmp_path / "a", "strange", kind="not-a-kind")
    _use(monkeypatch, tmp_path / "a")
    assert all_case_names() == ["known", "strange"]
    assert case_names() == ["known"]


def test_the_default_needs_only_the_first_folder(monkeypatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    dirs = oracle_dirs()
    assert dirs[0].name == "fixtures" and dirs[0].parent.name == "oracle"
    assert all(d.is_dir() for d in dirs[1:])


@pytest.mark.parametrize(
    ("label", "model_class", "kind"),
    [
        ("frame_stacking", "TorchFrameStackingCartPoleModel", "trajectory_view"),
        ("rnn", "TorchRNNModel", "custom_recurrent"),
        ("dqn", "FullyConnectedNetwork_as_DQNTorchModel", "q_model"),
        ("lstm", "FullyConnectedNetwork_as_LSTMWrapper", "lstm"),  # a known label is kept
    ],
)
def test_a_case_labelled_otherwise_takes_the_kind_of_its_rllib_class(tmp_path, monkeypatch, label, model_class,
                                                                      kind) -> None:
    path = tmp_path / "a" / "elsewhere"
    path.mkdir(parents=True)
    (path / "case.json").write_text(json.dumps({"kind": label, "model_class": model_class}))
    _use(monkeypatch, tmp_path / "a")
    assert case_names() == ["elsewhere"]
    assert read_meta("elsewhere")["kind"] == kind


def test_a_case_whose_class_says_nothing_keeps_its_unknown_label(tmp_path, monkeypatch) -> None:
    path = tmp_path / "a" / "odd"
    path.mkdir(parents=True)
    (path / "case.json").write_text(json.dumps({"kind": "mystery", "model_class": "SomethingElse"}))
    _use(monkeypatch, tmp_path / "a")
    assert all_case_names() == ["odd"] and case_names() == []
