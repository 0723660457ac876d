"""The README's settings table lists every setting, with its real default."""

from __future__ import annotations

import re
from pathlib import Path

from rlserve.service.settings import Settings

README = Path(__file__).resolve().parents[2] / "README.md"
# "embedded defaults", "unset", "per bundle", "unset", "unset (off)"
DESCRIBED_NOT_LITERAL = {"repository", "admin_token", "default_explore", "session_store", "grpc_port", "experience_log"}


def _table() -> dict[str, str]:
    rows = re.findall(r"^\| `RLSERVE_([A-Z0-9_]+)` \| (.+?) \|", README.read_text(), flags=re.M)
    return {name.lower(): default.strip() for name, default in rows}


def test_every_setting_is_documented_with_its_default() -> None:
    table = _table()
    fields = Settings.model_fields
    assert set(table) == set(fields), f"README settings table differs: {set(table) ^ set(fields)}"
    for name, field in fields.items():
        if name in DESCRIBED_NOT_LITERAL:
            continue
        default = field.default
        literal = str(default).lower() if isinstance(default, bool) else str(default)
        if isinstance(default, float) and default.is_integer():
            literal = str(int(default))
        assert table[name] == f"`{literal}`", (
            f"RLSERVE_{name.upper()}: README says {table[name]}, default is {default!r}"
        )
