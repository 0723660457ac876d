"""End to end: the embedded default policies, served by a real ``rlserve serve`` process,
play gymnasium episodes over HTTP.

``cartpole`` must balance the pole (greedy and sampled). ``cartpole-memory`` sees no
velocities, so it must do well only while the server keeps its LSTM state between steps:
with the state reset at every step (an episode start each step) it must fall far lower.
The thresholds are the training targets of docs/default_policies.md, not recorded scores.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.client import PolicyClient
from service.envs import DEFAULT_POLICY_ENVS, make_env
from service.gym_runner import run_episodes

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
EPISODES = 5
START_TIMEOUT_S = 120.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rlserve serve exited with status {proc.returncode} before it was ready")
        try:
            if httpx.get(f"{url}/readyz", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)  # polling readiness, not waiting for a result
    raise TimeoutError(f"rlserve serve not ready at {url} after {START_TIMEOUT_S}s")


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSERVE_")}  # embedded defaults
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--log-level", "warning"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def _mean_return(url: str, model: str, *, explore: bool, reset_state_every_step: bool = False) -> float:
    with PolicyClient(url, model, timeout=30.0) as client:
        stats = run_episodes(client, lambda: make_env(DEFAULT_POLICY_ENVS[model]), EPISODES,
                             parallel=EPISODES, seed=1234, explore=explore,
                             reset_state_every_step=reset_state_every_step)
    assert len(stats.returns) == EPISODES
    return stats.mean_return


def test_both_default_policies_are_served(server_url: str) -> None:
    served = {m["name"] for m in httpx.get(f"{server_url}/v1/models", timeout=10).json()["models"]}
    assert set(DEFAULT_POLICY_ENVS) <= served


@pytest.mark.parametrize("explore", [False, True], ids=["greedy", "sampled"])
def test_cartpole_balances_the_pole(server_url: str, explore: bool) -> None:
    assert _mean_return(server_url, "cartpole", explore=explore) >= 450.0


def test_cartpole_memory_needs_its_server_side_state(server_url: str) -> None:
    with_memory = _mean_return(server_url, "cartpole-memory", explore=False)
    without_memory = _mean_return(server_url, "cartpole-memory", explore=False, reset_state_every_step=True)
    assert with_memory >= 400.0
    assert without_memory <= 150.0
    assert with_memory >= 3 * without_memory
