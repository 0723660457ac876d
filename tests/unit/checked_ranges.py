"""A dependency whose private internals the project relies on is declared with an upper bound
and installed within it (test_uvicorn_internals.py, test_xdist_internals.py): an upgrade is
a decision, made by re-checking what relies on it, then widening the range."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def declared(name: str, extra: str | None = None) -> Requirement:
    """``name``'s requirement in pyproject.toml: the dependencies, or ``extra``'s."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    listed = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    (req,) = [r for r in map(Requirement, listed) if r.name == name]
    return req


def assert_bounded_and_installed(name: str, how_to_upgrade: str, extra: str | None = None) -> None:
    spec = declared(name, extra).specifier
    assert any(s.operator in ("<", "<=", "==", "~=") for s in spec), f"{name}{spec} has no upper bound"
    installed = Version(importlib.metadata.version(name))
    assert spec.contains(installed), (
        f"{name} {installed} is installed, pyproject declares {name}{spec}. {how_to_upgrade}")
