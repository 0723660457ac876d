"""Every command of docs/newstack.md runs as written (a new-stack checkpoint of tests/fixtures)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from server_process import REPO, rlserve_command

pytestmark = pytest.mark.e2e

DOC = REPO / "docs" / "newstack.md"
RLMODULE_CHECKPOINT = REPO / "tests" / "fixtures" / "newstack" / "ppo_lstm_prev2" / "checkpoint"


def _lines() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_the_documented_commands_run(tmp_path: Path) -> None:
    lines = _lines()
    assert lines and all(line.startswith(("rlserve export ", "rlserve inspect ")) for line in lines), lines
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSERVE_")}
    env["RLMODULE_CHECKPOINT"] = str(RLMODULE_CHECKPOINT)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    outputs = []
    for line in lines:
        command = shlex.join(rlserve_command()) + line[len("rlserve"):]
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, f"{line!r}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        outputs.append(done.stdout)
    inspected = outputs[-1]
    assert "RLlib new API stack (RLModule): module 'default_policy'" in inspected
    assert "PrevActionsPrevRewards" in inspected and "one-hot actions" in inspected
