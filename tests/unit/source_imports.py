"""A source file's module name and its imports' absolute names, for the import checks
(test_layering.py, test_no_deferred_imports.py)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def module_name(path: Path) -> str:
    """``rlserve.<...>`` of a file under models/ or service/ (service/client is ``rlserve.client``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[:2] == ["service", "client"]:
        parts = ["client", *parts[2:]]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["rlserve", *parts])


def package_of(path: Path) -> str:
    """The package a file's relative imports start from."""
    name = module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def from_module(node: ast.ImportFrom, package: str) -> str:
    """The absolute name of the module a ``from ... import`` statement imports from."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))
