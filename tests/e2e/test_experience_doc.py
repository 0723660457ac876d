"""docs/experience.md's commands run as written (the port and the log folder moved to
free ones), in the order a reader runs them; its block marked ``not-run`` (RLlib in an
environment of its own) is run by hand and its output recorded in the page."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from server_process import REPO, ServerProcess, rlserve_command

pytestmark = pytest.mark.e2e

DOC = REPO / "docs" / "experience.md"
FOLDER = "/tmp/rlserve-experience"
NOT_RUN = "<!-- not-run: needs ray in a separate venv -->"


def doc_lines() -> list[str]:
    """Every line of the page's bash blocks, except the blocks marked not-run."""
    text = DOC.read_text()
    lines = []
    for match in re.finditer(r"(?P<before>[^\n]*)\n```bash\n(?P<body>.*?)```", text, flags=re.S):
        if match["before"].strip() == NOT_RUN:
            continue
        lines += [line.strip() for line in match["body"].splitlines() if line.strip()]
    return lines


def _run(line: str, folder: Path, port: int) -> str:
    # The page's folders are under /tmp; here under the test's own folder.
    command = line.replace("/tmp/", f"{folder.parent}/").replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    if command.startswith("rlserve "):
        command = shlex.join(rlserve_command()) + command[len("rlserve"):]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSERVE_")}
    env.update(PATH=str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""), RLSERVE_PORT=str(port))
    done = subprocess.run(["bash", "-c", command], cwd=folder.parent, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"{line!r} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done.stdout


def test_the_not_run_block_is_the_ray_one_and_its_output_is_recorded():
    text = DOC.read_text()
    assert text.count(NOT_RUN) == 1
    ray_block = text.split(NOT_RUN, 1)[1].split("```", 2)[1]
    assert "ray[rllib]==2.60.0" in ray_block and "train_bc_on_experience.py" in ray_block
    assert re.search(r"BC iteration 1: loss \d", text), "the BC run's output is recorded"
    assert re.search(r"episodes read back; their lengths equal .*: True", text)


def test_the_pages_commands_collect_episodes_and_read_them(tmp_path):
    lines = doc_lines()
    serve, demo, summary, curl, to_json = lines  # every command of the page, claimed here
    assert serve == f"RLSERVE_EXPERIENCE_LOG={FOLDER} rlserve serve"
    assert demo.startswith("rlserve demo") and curl.startswith("curl ")
    folder = tmp_path / "rlserve-experience"
    server = ServerProcess({"RLSERVE_EXPERIENCE_LOG": str(folder)}).start()
    try:
        _run(demo, folder, server.port)
        assert json.loads(_run(curl, folder, server.port)) == {"accepted": 2}
        assert server.terminate() in (0, -signal.SIGTERM)  # Ctrl-C's shutdown writes the rest
    finally:
        server.stop()
    report = _run(summary, folder, server.port)
    assert re.search(r"model cartpole: \d+ transitions, 2 episodes \(2 whole", report), report
    assert re.search(r"model cartpole-memory: \d+ transitions, 2 episodes \(2 whole", report), report
    _run(to_json, folder, server.port)
    out = tmp_path / "rlserve-sample-batches"
    batches = [json.loads(line) for line in (out / "cartpole.json").read_text().splitlines()]
    assert len(batches) == 2 and all(b["type"] == "SampleBatch" for b in batches)
    for batch in batches:
        assert len(batch["obs"]) == len(batch["new_obs"]) == len(batch["actions"]) == len(batch["rewards"])
        assert batch["obs"][1:] == batch["new_obs"][:-1]
        assert batch["terminateds"][-1] or batch["truncateds"][-1]
