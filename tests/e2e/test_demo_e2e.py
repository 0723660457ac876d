"""`rlserve demo` plays what the server can serve: against `--workers 2` without a session
store (no sessions), the stateless `cartpole` is played in stateless requests and the
memory policy is skipped with the reason; neither fails."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from server_process import REPO, ServerProcess, rlserve_command

pytestmark = pytest.mark.e2e


def test_demo_plays_the_stateless_policy_on_workers_without_a_store() -> None:
    server = ServerProcess({}, args=["--workers", "2"])
    try:
        server.start()
        env = {k: v for k, v in os.environ.items() if not k.startswith("RLSERVE_")}
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        done = subprocess.run([*rlserve_command(), "demo", "--url", server.url, "--episodes", "2"], env=env,
                              capture_output=True, text=True, timeout=300)
    finally:
        server.stop()
    sys.stdout.write(done.stdout)
    assert done.returncode == 0, (done.stdout, done.stderr)
    lines = done.stdout.splitlines()
    (played,) = [line for line in lines if line.startswith("cartpole on CartPole-v1: returns ")]
    assert played.endswith("(stateless requests: this server keeps no sessions)"), played
    (skipped,) = [line for line in lines if line.startswith("cartpole-memory: skipped: ")]
    assert "RLSERVE_SESSION_STORE" in skipped, skipped  # the server's own reason, naming the fix
