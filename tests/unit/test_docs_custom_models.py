"""Every ```python block of docs/custom_models.md runs (in order, one namespace per block)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlserve.models.custom import unregister_custom_model

DOC = Path(__file__).resolve().parents[2] / "docs" / "custom_models.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_page_has_examples() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(index: int) -> None:
    try:
        exec(compile(BLOCKS[index], f"{DOC.name}[{index}]", "exec"), {"__name__": f"doc_example_{index}"})
    finally:
        for name in re.findall(r'register_custom_model\("([^"]+)"', BLOCKS[index]):
            unregister_custom_model(name)
