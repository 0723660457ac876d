"""The ``tritonclient`` examples of docs/api.md (HTTP and gRPC) run as written against `rlserve serve`.

Every fenced ``python`` block of docs/api.md that imports tritonclient is extracted and
run in its own interpreter against a real server on the embedded default models, serving
gRPC too; only the addresses come from the environment (``RLSERVE_URL`` and
``RLSERVE_GRPC_URL``, which the examples read).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from server_process import REPO, free_port, running_server

pytestmark = pytest.mark.e2e

API_DOC = REPO / "docs" / "api.md"


def tritonclient_blocks() -> dict[str, str]:
    """The examples by the client they import: "http" and "grpc"."""
    blocks = re.findall(r"```python\n(.*?)```", API_DOC.read_text(), flags=re.S)
    found = re.compile(r"^import tritonclient\.(\w+)", re.M)
    return {found.search(block)[1]: block for block in blocks if found.search(block)}


def test_the_doc_has_a_tritonclient_example_per_transport():
    blocks = tritonclient_blocks()
    assert sorted(blocks) == ["grpc", "http"]
    for block in blocks.values():
        assert "set_data_from_numpy" in block and "sequence_id" in block


def test_the_tritonclient_examples_run_against_a_real_server(tmp_path):
    grpc_port = free_port()
    with running_server(["--grpc-port", str(grpc_port)]) as url:
        env = {**os.environ, "RLSERVE_URL": url.removeprefix("http://"), "RLSERVE_GRPC_URL": f"127.0.0.1:{grpc_port}"}
        for transport, block in tritonclient_blocks().items():
            script = tmp_path / f"example_{transport}.py"
            script.write_text(block)
            proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                                  timeout=120)
            assert proc.returncode == 0, f"{transport}: {proc.stderr}"
            lines = proc.stdout.splitlines()
            assert lines[0] == "['obs', 'action_mask']", transport
            assert lines[-1].startswith("last action "), transport
