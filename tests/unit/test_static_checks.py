"""The linter and the type checker pass on the repository (DESIGN.md: "a type checker and a
linter in CI"). Both run as subprocesses from the repository root, so they read the
``[tool.ruff]`` and ``[tool.mypy]`` sections of pyproject.toml exactly as a developer's
``ruff check .`` would. Their caches go under the system temp dir so the checkout stays clean,
in a folder of this checkout's own (two checkouts checked at once must not relink each
other's package tree).

mypy cannot follow setuptools' editable-install finder, so it reads the packages through a
tree of links laid out as the wheel installs them (``rlserve/models``, ``rlserve/service``,
``rlserve/client``), the same mapping as ``[tool.setuptools] package-dir``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(tempfile.gettempdir()) / f"rlserve-static-checks-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]}"



def _package_tree() -> tuple[Path, list[str]]:
    """Links ``<tmp>/<package path>`` -> repository folder for every package-dir entry."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    tree = CACHE / "packages"
    targets = []
    for package, folder in config["package-dir"].items():
        link = tree.joinpath(*package.split("."))
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(ROOT / folder, target_is_directory=True)
        targets += ["-p", package]
    return tree, targets


def _run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
        env=None if env is None else {**os.environ, **env},
    )


def _report(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit code {proc.returncode}\n{proc.stdout}\n{proc.stderr}"


def test_ruff_is_clean() -> None:
    proc = _run(["ruff", "check", ".", "--cache-dir", str(CACHE / "ruff")])
    assert proc.returncode == 0, "ruff check . failed:\n" + _report(proc)


def test_mypy_is_clean() -> None:
    tree, targets = _package_tree()
    # service/client is the rlserve.client package, not a part of rlserve.service.
    args = ["mypy", "--cache-dir", str(CACHE / "mypy"), "--exclude", "rlserve/service/client/", *targets]
    proc = _run(args, env={"MYPYPATH": str(tree)})
    assert proc.returncode == 0, f"mypy {' '.join(targets)} failed:\n" + _report(proc)
    # A run that checked nothing would also exit 0.
    assert "Success" in proc.stdout, _report(proc)
