"""The installed pytest-xdist is one that tests/conftest.py's scheduler was checked against.

The default run's scheduler (tests/xdist_units.py, made by tests/conftest.py) overrides
xdist's private ``_split_scope`` so that each test file, and tests/conformance as a whole, is
one unit of work. A release that renamed the method, or stopped calling it, would spread a
file's tests over both workers (module-scoped servers started twice, the conformance
coverage check skipped): the conftest stops the run then, and this test fails as soon as an
xdist outside the checked range is installed, so that an upgrade is a decision.
"""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version
from xdist_units import XDIST_CHECKED, xdist_scope_problem

REPO = Path(__file__).resolve().parents[2]


def _declared_xdist() -> Requirement:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (req,) = [r for r in map(Requirement, extras["test"]) if r.name == "pytest-xdist"]
    return req


def test_the_declared_xdist_range_is_bounded_above_and_admits_the_installed_one():
    spec = _declared_xdist().specifier
    assert any(s.operator in ("<", "<=", "==", "~=") for s in spec), f"pytest-xdist{spec} has no upper bound"
    installed = Version(importlib.metadata.version("pytest-xdist"))
    assert spec.contains(installed), (
        f"pytest-xdist {installed} is installed, pyproject declares pytest-xdist{spec}: tests/conftest.py's "
        f"scheduler was checked against {XDIST_CHECKED}; re-check it, then widen both")


def test_the_private_scope_api_the_scheduler_overrides_is_there():
    assert xdist_scope_problem() is None
