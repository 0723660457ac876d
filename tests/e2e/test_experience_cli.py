"""``rlserve experience`` on what a real server logged, and the BC run recorded in the page.

The page's own commands (serve, demo, summary, the rewards route, to-json) are run verbatim
by the doc runner (tests/docs); here the CLI's answers are checked against the episodes the
client really played: the counts and returns ``summary --json`` reports, and the old stack's
SampleBatch lines ``to-json`` writes (each step's next observation is the next step's).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess

import gymnasium as gym
import pytest
from server_process import REPO, ServerProcess, rlserve_command

from rlserve.client.gym_runner import run_episodes
from rlserve.client.policy_client import PolicyClient

pytestmark = pytest.mark.e2e

DOC = REPO / "docs" / "experience.md"


def test_the_bc_run_on_a_log_is_recorded_in_the_page():
    text = DOC.read_text()
    ray_blocks = re.findall(r"<!-- not-run: ray -->\n```(\w+)\n(.*?)```", text, flags=re.S)
    assert [lang for lang, _ in ray_blocks] == ["bash", "python"]
    assert "ray[rllib]==2.60.0" in ray_blocks[0][1] and "train_bc_on_experience.py" in ray_blocks[0][1]
    assert "BCConfig()" in ray_blocks[1][1]
    assert re.search(r"BC iteration 1: loss \d", text), "the BC run's output is recorded"
    assert len(re.findall(r"episodes read back; their lengths equal .*: True", text)) == 2


def _cli(*args: str) -> str:
    done = subprocess.run([*rlserve_command(), "experience", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_summary_and_to_json_read_back_the_played_episodes(tmp_path):
    log = tmp_path / "log"
    server = ServerProcess({"RLSERVE_EXPERIENCE_LOG": str(log)}).start()
    try:
        stats = run_episodes(PolicyClient(server.url, "cartpole"), lambda: gym.make("CartPole-v1"), 3,
                             parallel=3, seed=7, explore=True, max_steps=40)
        assert server.terminate() in (0, -signal.SIGTERM)  # the shutdown writes what the log holds
    finally:
        server.stop()
    summary = json.loads(_cli("summary", str(log), "--model", "cartpole", "--json"))["cartpole"]
    assert summary["episodes"] == summary["whole_episodes"] == 3 and summary["unfinished_or_partial"] == 0
    assert summary["transitions"] == sum(stats.lengths)
    assert sorted(summary["returns"].values()) == sorted(stats.returns)
    assert summary["steps_without_explore"] == 0

    out = tmp_path / "batches"
    _cli("to-json", str(log), str(out), "--model", "cartpole")
    batches = [json.loads(line) for line in (out / "cartpole.json").read_text().splitlines()]
    assert sorted(len(b["obs"]) for b in batches) == sorted(stats.lengths)
    for batch in batches:
        assert batch["type"] == "SampleBatch" and len(set(batch["eps_id"])) == 1
        assert len(batch["obs"]) == len(batch["new_obs"]) == len(batch["actions"]) == len(batch["rewards"])
        assert batch["obs"][1:] == batch["new_obs"][:-1] and batch["t"] == list(range(len(batch["obs"])))
        assert batch["terminateds"][-1] != batch["truncateds"][-1]  # ended one way, as the runner said
        assert not any(batch["terminateds"][:-1] + batch["truncateds"][:-1])
