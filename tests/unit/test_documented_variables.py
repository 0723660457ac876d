"""Every ``RLSERVE_*`` name the docs and the shipped files mention is a setting or a declared
non-setting variable (one the docs ask clients to export, or one a tool reads), so that
exporting it as the docs say never stops ``rlserve serve`` as a misspelt setting."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlserve.service.settings import CLIENT_VARIABLES, NOT_SETTINGS, PREFIX, Settings, check_environment

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docker").rglob("*")),
           ROOT / "Dockerfile"]
# Names the docs use that are no variable of their own: a typo's example, what Kubernetes's
# service links would add (docs/kubernetes.md turns them off for that reason), and a
# placeholder for any setting (benchmarks.md's `--env RLSERVE_X=Y`).
NOT_VARIABLES = {"RLSERVE_MAX_BATCH_SIZ", "RLSERVE_SERVICE_HOST", "RLSERVE_X"}


def _mentioned() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in SOURCES:
        if path.is_file():
            for name in re.findall(r"\bRLSERVE_[A-Z0-9_]*[A-Z0-9]", path.read_text(errors="replace")):
                found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def test_every_mentioned_variable_is_declared() -> None:
    settings = {PREFIX + name.upper() for name in Settings.model_fields}
    undeclared = {name: where for name, where in _mentioned().items()
                  if name not in settings and name not in NOT_SETTINGS and name not in NOT_VARIABLES}
    assert not undeclared, f"declare these in CLIENT_VARIABLES or TOOL_VARIABLES (service/settings.py): {undeclared}"


def test_the_grpc_example_variable_is_a_client_variable() -> None:
    assert "RLSERVE_GRPC_URL" in CLIENT_VARIABLES and "RLSERVE_URL" in CLIENT_VARIABLES
    api = (ROOT / "docs" / "api.md").read_text()
    assert 'os.environ.get("RLSERVE_GRPC_URL"' in api  # what the docs' gRPC example reads


@pytest.mark.parametrize("name", sorted(NOT_SETTINGS))
def test_declared_variables_are_no_typo(name: str) -> None:
    check_environment({name: "x"})  # raises UnknownSetting for a misspelt setting
