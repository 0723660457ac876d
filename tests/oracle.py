"""Loader for RLlib oracle fixtures (format: shared/oracle/check_format.md).

The folder comes from ``RLSERVE_ORACLE_DIR`` (default ``../shared/oracle/fixtures``
relative to the repository root), so other folders of the same format can be run.
Nothing here knows case names: tests select cases by ``kind`` and by which keys exist.
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


def oracle_dir() -> Path:
    env = os.environ.get("RLSERVE_ORACLE_DIR")
    if env:
        return Path(env).expanduser().resolve()
    return (REPO_ROOT / ".." / "shared" / "oracle" / "fixtures").resolve()


def case_names() -> list[str]:
    root = oracle_dir()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "case.json").is_file())


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


@cache
def load_case(name: str) -> OracleCase:
    path = oracle_dir() / name
    meta = json.loads((path / "case.json").read_text())
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


@cache
def read_meta(name: str) -> dict[str, Any]:
    """A case's case.json, without loading its arrays."""
    return json.loads((oracle_dir() / name / "case.json").read_text())


@cache
def io_key_names(name: str) -> tuple[str, ...]:
    """The io.npz key names of a case, without reading the arrays."""
    with np.load(oracle_dir() / name / "io.npz", allow_pickle=False) as z:
        return tuple(z.files)


NO_CASES_PREFIX = "<no cases"


def select_cases(predicate: Any) -> list[str]:
    """Names of the cases for which ``predicate(name)`` holds.

    An empty or missing folder gives one placeholder name (starting with
    ``NO_CASES_PREFIX``) that the tests turn into a failure. A folder that has cases but
    none this test applies to gives an empty list: pytest reports that test as skipped
    ("empty parameter set"), which is right for a fixture folder without, say, a filter
    case; test_coverage.py separately requires a non-empty, fully checked folder.
    """
    names = case_names()
    if not names:
        return [f"{NO_CASES_PREFIX} in {oracle_dir()}>"]
    return [n for n in names if predicate(n)]
