"""docs/action-heads.md's example runs and its assertions hold."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "action-heads.md"


def test_the_documented_example_runs(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 1, "docs/action-heads.md should hold exactly one python example"
    exec(compile(blocks[0], str(DOC), "exec"), {"OUT": tmp_path, "__name__": "doc_example"})
