"""The ``tritonclient`` example of docs/api.md runs as written against `rlserve serve`.

Every fenced ``python`` block of docs/api.md that uses tritonclient is extracted and run
in its own interpreter against a real server on the embedded default models; only the
address comes from the environment (``RLSERVE_URL``, which the example reads).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from server_process import REPO, running_server

pytestmark = pytest.mark.e2e

API_DOC = REPO / "docs" / "api.md"


def tritonclient_blocks() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", API_DOC.read_text(), flags=re.S)
    return [block for block in blocks if "tritonclient" in block]


def test_the_doc_has_a_tritonclient_example():
    blocks = tritonclient_blocks()
    assert len(blocks) == 1
    assert "set_data_from_numpy" in blocks[0] and "sequence_id" in blocks[0]


def test_the_tritonclient_example_runs_against_a_real_server(tmp_path):
    (block,) = tritonclient_blocks()
    script = tmp_path / "example.py"
    script.write_text(block)
    with running_server() as url:
        env = {**os.environ, "RLSERVE_URL": url.removeprefix("http://")}
        proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "['obs', 'action_mask']"
    assert lines[-1].startswith("last action ")
