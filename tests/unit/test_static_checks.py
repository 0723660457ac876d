"""The linter and the type checker pass on the repository (DESIGN.md: "a type checker and a
linter in CI"). Both run as subprocesses from the repository root, so they read the
``[tool.ruff]`` and ``[tool.mypy]`` sections of pyproject.toml exactly as a developer's
``ruff check .`` / ``mypy models`` would. Their caches go under the system temp dir so the
checkout stays clean.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(tempfile.gettempdir()) / "rlserve-static-checks"

MYPY_TARGETS = ["models", "service"]


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def _report(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit code {proc.returncode}\n{proc.stdout}\n{proc.stderr}"


def test_ruff_is_clean() -> None:
    proc = _run(["ruff", "check", ".", "--cache-dir", str(CACHE / "ruff")])
    assert proc.returncode == 0, "ruff check . failed:\n" + _report(proc)


def test_mypy_is_clean() -> None:
    proc = _run(["mypy", "--cache-dir", str(CACHE / "mypy"), *MYPY_TARGETS])
    assert proc.returncode == 0, f"mypy {' '.join(MYPY_TARGETS)} failed:\n" + _report(proc)
    # A run that checked nothing would also exit 0.
    assert "Success" in proc.stdout, _report(proc)
