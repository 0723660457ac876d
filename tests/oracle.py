"""Loader for RLlib oracle fixtures (format: shared/oracle/check_format.md).

The case folders come from ``RLSERVE_ORACLE_DIR``: one folder or several separated by
``os.pathsep``. By default they are ``../shared/oracle/fixtures`` (relative to the
repository root, required), then ``../shared/oracle/fixtures-next`` (the newer kinds) and
``tests/fixtures/oracle`` (the cases this repository records itself), each skipped while
absent. A folder named explicitly must exist, and a case
name must be unique across the folders: both are errors, never a silent skip. One folder
holding the merged contents of several works the same as naming them all.

Nothing here knows case names: tests select cases by ``kind`` and by which keys exist.
``case_names()`` lists the cases of the kinds the conformance suite knows
(``KNOWN_KINDS``); a case of another kind is listed by ``all_case_names()`` only, and
test_coverage.py fails on it once, clearly, instead of every generic test tripping on it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
ENV_VAR = "RLSERVE_ORACLE_DIR"
KNOWN_KINDS = ("feedforward", "lstm", "attention", "filter", "q_model", "autoregressive", "custom_recurrent",
               "trajectory_view", "batch_norm", "parametric_actions")


class OracleFolderError(Exception):
    """The oracle folders are misconfigured (a named folder is missing, a case name repeats)."""


def _default_dirs() -> tuple[tuple[Path, bool], ...]:
    """(folder, required) in search order."""
    shared = (REPO_ROOT / ".." / "shared" / "oracle").resolve()
    return (
        (shared / "fixtures", True),
        (shared / "fixtures-next", False),
        (REPO_ROOT / "tests" / "fixtures" / "oracle", False),
    )


def oracle_dirs() -> tuple[Path, ...]:
    """The case folders in search order. Missing required folders stay in (their tests fail)."""
    env = os.environ.get(ENV_VAR)
    if env:
        named = [Path(p).expanduser().resolve() for p in env.split(os.pathsep) if p.strip()]
        missing = [str(p) for p in named if not p.is_dir()]
        if missing or not named:
            raise OracleFolderError(f"{ENV_VAR}={env!r} names folders that do not exist: {missing}")
        return tuple(named)
    return tuple(path for path, required in _default_dirs() if required or path.is_dir())


def oracle_dirs_text() -> str:
    """The folders for messages ("looked in ...")."""
    return os.pathsep.join(str(p) for p in oracle_dirs())


@cache
def _index(dirs: tuple[Path, ...]) -> dict[str, Path]:
    index: dict[str, Path] = {}
    for root in dirs:
        if not root.is_dir():
            continue
        for path in sorted(root.iterdir()):
            if not (path / "case.json").is_file():
                continue
            if path.name in index:
                raise OracleFolderError(
                    f"case {path.name!r} is in both {index[path.name].parent} and {root}: "
                    f"case names must be unique across the {ENV_VAR} folders"
                )
            index[path.name] = path
    return index


def case_dir(name: str) -> Path:
    """The folder of case ``name`` (whichever oracle folder holds it)."""
    return _index(oracle_dirs())[name]


def all_case_names() -> list[str]:
    """Every case in every folder, whatever its kind."""
    return sorted(_index(oracle_dirs()))


def case_names() -> list[str]:
    """The cases of the kinds the conformance suite knows (``KNOWN_KINDS``)."""
    return [n for n in all_case_names() if read_meta(n).get("kind") in KNOWN_KINDS]


@dataclass
class OracleCase:
    name: str
    path: Path
    meta: dict[str, Any]
    io: dict[str, np.ndarray]
    weights: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.meta["kind"]

    def keys_under(self, prefix: str) -> list[str]:
        """io keys equal to ``prefix`` or below ``prefix/``."""
        return [k for k in self.io if k == prefix or k.startswith(prefix + "/")]

    def tree(self, prefix: str) -> dict[str, np.ndarray]:
        """Leaves under ``prefix`` keyed by their path relative to it ('' for a root leaf)."""
        out = {}
        for k in self.keys_under(prefix):
            out[k[len(prefix) + 1:] if k != prefix else ""] = self.io[k]
        return out


def load_case(name: str) -> OracleCase:
    """Case ``name``; a placeholder of ``select_cases``/``cases_of_kind`` fails the test."""
    if name.startswith(NO_CASES_PREFIX):
        import pytest

        pytest.fail(f"no oracle case: {name} (set RLSERVE_ORACLE_DIR)")
    return _load_case(case_dir(name))


def load_case_at(path: Path) -> OracleCase:
    """A case folder named by its path (the recorded cases of tests/fixtures/oracle, which
    some tests use whatever ``RLSERVE_ORACLE_DIR`` says)."""
    return _load_case(path)


def case_model(case: OracleCase) -> tuple[Any, Any, Any, dict[str, Any]]:
    """(model, obs space, action space, model config): the case's model as the catalog
    builds it from the raw spaces and the recorded config merged with MODEL_DEFAULTS, with
    RLlib's weights loaded (the module's mode is left as built)."""
    from rlserve.models.catalog import build_model
    from rlserve.models.config import merge_model_config
    from rlserve.models.rllib_import import load_rllib_weights
    from rlserve.models.spaces import space_from_json

    obs_space = space_from_json(case.meta["observation_space"])
    action_space = space_from_json(case.meta["action_space"])
    config = merge_model_config(case.meta["model_config"], action_space)
    model = build_model(obs_space, action_space, config, num_outputs=case.meta["num_outputs"])
    load_rllib_weights(model, case.weights)
    return model, obs_space, action_space, config


@cache
def _load_case(path: Path) -> OracleCase:
    name = path.name
    meta = _read_json(path / "case.json")
    with np.load(path / "io.npz", allow_pickle=False) as z:
        io = {k: z[k] for k in z.files}
    weights: dict[str, np.ndarray] = {}
    if (path / "weights.npz").is_file():
        with np.load(path / "weights.npz", allow_pickle=False) as z:
            weights = {k: z[k] for k in z.files}
    return OracleCase(name=name, path=path, meta=meta, io=io, weights=weights)


def assert_close(actual: Any, expected: np.ndarray, what: str, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != expected {expected.shape}"
    if expected.dtype.kind in "iub":
        np.testing.assert_array_equal(actual, expected, err_msg=what)
    else:
        np.testing.assert_allclose(
            actual.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol, err_msg=what
        )


def read_meta(name: str) -> dict[str, Any]:
    """A case's case.json, without loading its arrays."""
    return _read_json(case_dir(name) / "case.json")


@cache
def _read_json(path: Path) -> dict[str, Any]:
    return canonical_kind(json.loads(path.read_text()))


# RLlib's model classes whose kind is unambiguous, for cases recorded elsewhere under a kind
# label this suite does not use (the label is free text; the class is RLlib's own name).
_KIND_OF_CLASS = {
    "DQNTorchModel": "q_model",
    "TorchAutoregressiveActionModel": "autoregressive",
    "TorchRNNModel": "custom_recurrent",
    "TorchFrameStackingCartPoleModel": "trajectory_view",
    "TorchBatchNormModel": "batch_norm",
    "TorchParametricActionsModel": "parametric_actions",
}


def canonical_kind(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` with ``kind`` one of ``KNOWN_KINDS`` where its RLlib model class says which.

    A known label is kept. An unknown one (say ``frame_stacking`` for a trajectory-view
    case) is replaced by the kind of its model class, the last ``_as_`` part first, and the
    label is kept as ``recorded_kind``. A case whose class says nothing keeps its label and
    fails test_coverage.py's kind check.
    """
    kind = meta.get("kind")
    if kind in KNOWN_KINDS:
        return meta
    model_class = str(meta.get("model_class") or "")
    for part in reversed(model_class.split("_as_")):
        if part in _KIND_OF_CLASS:
            return {**meta, "kind": _KIND_OF_CLASS[part], "recorded_kind": kind}
    return meta


def io_key_names(name: str) -> tuple[str, ...]:
    """The io.npz key names of a case, without reading the arrays."""
    return _npz_keys(case_dir(name) / "io.npz")


@cache
def _npz_keys(path: Path) -> tuple[str, ...]:
    with np.load(path, allow_pickle=False) as z:
        return tuple(z.files)


NO_CASES_PREFIX = "<no cases"


def select_cases(predicate: Any) -> list[str]:
    """Names of the cases for which ``predicate(name)`` holds.

    An empty or missing folder gives one placeholder name (starting with
    ``NO_CASES_PREFIX``) that the tests turn into a failure. A folder that has cases but
    none this test applies to gives an empty list: pytest reports that test as skipped
    ("empty parameter set"). A test of some kinds selects with ``cases_of_kind`` instead,
    and test_coverage.py requires a case of every kind the suite knows.
    """
    names = case_names()
    if not names:
        return [f"{NO_CASES_PREFIX} in {oracle_dirs_text()}>"]
    return [n for n in names if predicate(n)]


def cases_of_kind(*kinds: str) -> list[str]:
    """Names of the cases of ``kinds`` (case.json's ``kind``); none gives one placeholder
    name (starting with ``NO_CASES_PREFIX``) that the tests turn into a failure, never an
    empty parameter set that pytest would skip."""
    names = [n for n in case_names() if read_meta(n).get("kind") in kinds]
    return names or [f"{NO_CASES_PREFIX} of kind {' or '.join(kinds)} in {oracle_dirs_text()}>"]


# case.json model_config entries that record how the case was registered, not config:
# the registered names behind the dotted ``custom_model``/``custom_action_dist`` paths.
REGISTRATION_NOTES = ("custom_model_registered_as", "custom_action_dist_registered_as")


def catalog_config(meta: dict[str, Any]) -> dict[str, Any]:
    """The model config the catalog builds a case from: RLlib's recorded ``model_config``
    without the registration notes, plus DQN's settings (``dqn_config``) as the
    ``q_model`` block when the case has them."""
    config = {k: v for k, v in meta["model_config"].items() if k not in REGISTRATION_NOTES}
    if "dqn_config" in meta:
        config["q_model"] = dict(meta["dqn_config"])
    return config
