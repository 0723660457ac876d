"""The settings tables (README.md, docs/api.md) list every setting; the README's with its real default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlserve.service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
API = ROOT / "docs" / "api.md"
# "embedded defaults", "unset", "per bundle", "unset", "unset (off)", "$XDG_CACHE_HOME/...", ..., "unset (off)" x2
DESCRIBED_NOT_LITERAL = {"repository", "admin_token", "default_explore", "session_store", "grpc_port", "export_cache",
                         "agent_mapping", "experience_log", "canary_guard", "openpi_model"}


def _table(path: Path) -> dict[str, str]:
    """``name -> default`` of every table row that starts with `RLSERVE_...` (a row may name
    two, as docs/api.md's `RLSERVE_HOST`, `RLSERVE_PORT`)."""
    table = {}
    for names, default in re.findall(r"^\| (`RLSERVE_[A-Z0-9_]+`(?:, `RLSERVE_[A-Z0-9_]+`)*) \| (.+?) \|",
                                     path.read_text(), flags=re.M):
        for name in re.findall(r"`RLSERVE_([A-Z0-9_]+)`", names):
            table[name.lower()] = default.strip()
    return table


@pytest.mark.parametrize("path", [README, API], ids=["README", "api.md"])
def test_every_setting_is_in_the_table(path: Path) -> None:
    table = _table(path)
    fields = Settings.model_fields
    assert set(table) == set(fields), f"{path.name} settings table differs: {set(table) ^ set(fields)}"


def test_the_readme_says_each_default() -> None:
    table = _table(README)
    for name, field in Settings.model_fields.items():
        if name in DESCRIBED_NOT_LITERAL:
            continue
        default = field.default
        literal = str(default).lower() if isinstance(default, bool) else str(default)
        if isinstance(default, float) and default.is_integer():
            literal = str(int(default))
        assert table[name] == f"`{literal}`", (
            f"RLSERVE_{name.upper()}: README says {table[name]}, default is {default!r}"
        )


def test_the_api_page_names_the_checkpoint_flag() -> None:
    assert "--checkpoint [NAME=]DIR" in API.read_text()
