"""The oracle folder is loaded whole and every key in it is compared by some test.

Static checks (run under any selection): the folder holds cases and nothing half-copied,
MANIFEST.json (when present) agrees with the folders, every case has a known ``kind``,
io.npz holds exactly the arrays case.json's ``io_keys`` describes, every io key is of a
kind some test compares (``keys_checked.KEY_RULES``) and every case.json field is known.

The last test of the run (moved there by ``conftest.py``) asserts, when the whole folder
ran without failures, that the tests marked every io key and behavioural case.json field
of every case as compared (``keys_checked.mark_io`` / ``mark_fields``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from oracle import (
    KNOWN_KINDS,
    OracleCase,
    all_case_names,
    case_names,
    load_case,
    oracle_dirs,
    oracle_dirs_text,
    read_meta,
)

from conformance.keys_checked import (
    BEHAVIOUR_FIELDS,
    INFORMATIONAL_FIELDS,
    checked_fields,
    checked_io,
    field_present,
    mark_fields,
    rule_for,
)

_NO_CASES = "<no cases>"


def _names() -> list[str]:
    # Every case, also of kinds the suite does not know: those fail test_case_kind_is_known.
    return all_case_names() or [_NO_CASES]


def _case(name: str) -> OracleCase:
    if name == _NO_CASES:
        pytest.fail(f"no oracle cases found: set RLSERVE_ORACLE_DIR (looked in {oracle_dirs_text()})")
    return load_case(name)


@pytest.mark.parametrize("root", oracle_dirs(), ids=str)
def test_folder_holds_complete_cases(root: Path) -> None:
    assert root.is_dir(), f"oracle folder {root} does not exist (RLSERVE_ORACLE_DIR)"
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert folders, f"oracle folder {root} holds no cases"
    half = [p.name for p in folders if not ((p / "case.json").is_file() and (p / "io.npz").is_file())]
    assert not half, f"case folders without case.json or io.npz would be skipped silently: {half}"
    assert all(load_case(p.name).path == p for p in folders), f"{root}: a case resolves to another folder"


@pytest.mark.parametrize("root", oracle_dirs(), ids=str)
def test_manifest_agrees_with_the_folders(root: Path) -> None:
    manifest_path = root / "MANIFEST.json"
    if not manifest_path.is_file():
        pytest.skip(f"{root} has no MANIFEST.json (optional; the case folders are the contract)")
    listed = json.loads(manifest_path.read_text())["cases"]
    present = {p.name for p in root.iterdir() if (p / "case.json").is_file()}
    missing = sorted(set(listed) - present)
    assert not missing, f"MANIFEST.json lists cases whose folders are missing: {missing}"
    unlisted = sorted(present - set(listed))
    assert not unlisted, f"case folders not in MANIFEST.json: {unlisted}"
    for name, entry in listed.items():
        meta = load_case(name).meta
        assert entry["kind"] == meta["kind"], name
        assert entry.get("model_class") == meta.get("model_class"), name
        assert entry.get("action_dist") == (meta.get("action_dist") or {}).get("class"), name
        assert entry.get("dist_errors", {}) == meta.get("dist_errors", {}), name


# Where the cases of each kind come from (the shared folders, or this repository's own).
_KIND_SOURCES = {"q_model": "../shared/oracle/fixtures-next", "autoregressive": "../shared/oracle/fixtures-next",
                 **dict.fromkeys(("custom_recurrent", "trajectory_view", "batch_norm", "parametric_actions"),
                                 "tests/fixtures/oracle")}


@pytest.mark.parametrize("kind", KNOWN_KINDS)
def test_every_known_kind_has_a_case(kind: str) -> None:
    """A kind without a case would leave its tests nothing to compare (and let them skip):
    the folders must hold at least one case of every kind the suite knows."""
    kinds = {read_meta(name).get("kind") for name in case_names()}
    assert kind in kinds, (
        f"no oracle case of kind {kind!r} in {oracle_dirs_text()}; its cases live in "
        f"{_KIND_SOURCES.get(kind, '../shared/oracle/fixtures')} (RLSERVE_ORACLE_DIR must name that folder too)")


@pytest.mark.parametrize("name", _names())
def test_case_kind_is_known(name: str) -> None:
    case = _case(name)
    assert case.kind in KNOWN_KINDS, (
        f"{name} ({case.path.parent}): kind {case.kind!r} is not supported by the conformance suite, "
        f"which knows {KNOWN_KINDS}; its other tests leave this case out"
    )
    weights = (case.path / "weights.npz").is_file()
    assert weights == (case.kind != "filter"), f"{name}: kind {case.kind!r} but weights.npz present={weights}"
    if case.kind in ("lstm", "attention", "custom_recurrent"):
        assert case.meta["state"]["type"] == case.kind, f"{name}: state.type != kind"


@pytest.mark.parametrize("name", _names())
def test_io_npz_matches_its_description(name: str) -> None:
    case = _case(name)
    described = case.meta["io_keys"]
    assert sorted(case.io) == sorted(described), (
        f"{name}: io.npz keys differ from case.json io_keys: only in io.npz "
        f"{sorted(set(case.io) - set(described))}, only in case.json {sorted(set(described) - set(case.io))}"
    )
    for key, spec in described.items():
        array = case.io[key]
        assert list(array.shape) == list(spec["shape"]), f"{name}/{key}: shape {array.shape} != {spec['shape']}"
        assert np.dtype(spec["dtype"]) == array.dtype, f"{name}/{key}: dtype {array.dtype} != {spec['dtype']}"
    if "batch_size" in case.meta:
        lead = (case.meta["T"], case.meta["batch_size"]) if "T" in case.meta else (case.meta["batch_size"],)
        for key in (k for k in ("obs_flat", "model_out", "value") if k in case.io):
            assert case.io[key].shape[: len(lead)] == lead, f"{name}/{key}: leading axes != {lead} (T, B)"
        mark_fields(case, "batch_size", *(["T"] if "T" in case.meta else []))
    mark_fields(case, "io_keys")


@pytest.mark.parametrize("name", _names())
def test_every_io_key_is_of_a_compared_kind(name: str) -> None:
    case = _case(name)
    unknown = sorted(k for k in case.io if rule_for(k) is None)
    assert not unknown, (
        f"{name}: io keys of a kind no conformance test compares: {unknown}. Add a comparison "
        "and a rule in tests/conformance/keys_checked.py"
    )


def _field_paths(meta: dict) -> list[str]:
    """Top-level fields plus the sub-fields of the containers listed in BEHAVIOUR_FIELDS."""
    containers = {f.split(".")[0] for f in BEHAVIOUR_FIELDS if "." in f}
    paths = list(meta)
    for name in containers & set(meta):
        if isinstance(meta[name], dict):
            paths += [f"{name}.{sub}" for sub in meta[name]]
    return paths


@pytest.mark.parametrize("name", _names())
def test_every_case_json_field_is_known(name: str) -> None:
    case = _case(name)
    known = set(BEHAVIOUR_FIELDS) | set(INFORMATIONAL_FIELDS)
    unknown = sorted(p for p in _field_paths(case.meta) if p not in known)
    assert not unknown, (
        f"{name}: case.json fields nobody has classified: {unknown}. If one carries behaviour, "
        "compare it in a test and list it in keys_checked.BEHAVIOUR_FIELDS, else in INFORMATIONAL_FIELDS"
    )


def test_every_key_and_field_was_compared(conformance_run: str | None) -> None:
    """Runs last. Every io key and behavioural case.json field of every case was marked."""
    if conformance_run is not None:
        pytest.skip(f"coverage is asserted only after a clean run of the whole folder: {conformance_run}")
    gaps = []
    for name in all_case_names():
        case = load_case(name)
        keys = sorted(set(case.io) - checked_io(case))
        fields = sorted(f for f in BEHAVIOUR_FIELDS if field_present(case.meta, f) and f not in checked_fields(case))
        if keys or fields:
            gaps.append(f"{name}: io keys {keys}, case.json fields {fields}")
    assert case_names(), f"no oracle cases in {oracle_dirs_text()}"
    assert not gaps, "compared by no conformance test:\n" + "\n".join(gaps)
