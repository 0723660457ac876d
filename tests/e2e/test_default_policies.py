"""End to end: the embedded default policies, served by a real ``rlserve serve`` process,
play gymnasium episodes over HTTP.

``cartpole`` must balance the pole (greedy and sampled). ``cartpole-memory`` sees no
velocities, so it must do well only while the server keeps its LSTM state between steps:
with the state reset at every step (an episode start each step) it must fall far lower.
The thresholds are the training targets of docs/default_policies.md, not recorded scores.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from plain_http import HTTP
from server_process import running_server

from rlserve.client.envs import DEFAULT_POLICY_ENVS, make_env
from rlserve.client.gym_runner import run_episodes
from rlserve.client.policy_client import PolicyClient

pytestmark = pytest.mark.e2e

EPISODES = 5


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    with running_server() as url:  # no repository: the embedded defaults
        yield url


def _mean_return(url: str, model: str, *, explore: bool, reset_state_every_step: bool = False) -> float:
    with PolicyClient(url, model, timeout=30.0) as client:
        stats = run_episodes(client, lambda: make_env(DEFAULT_POLICY_ENVS[model]), EPISODES,
                             parallel=EPISODES, seed=1234, explore=explore,
                             reset_state_every_step=reset_state_every_step)
    assert len(stats.returns) == EPISODES
    return stats.mean_return


def test_both_default_policies_are_served(server_url: str) -> None:
    served = {m["name"] for m in HTTP.get(f"{server_url}/v1/models", timeout=10).json()["models"]}
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
    print(f"cartpole-memory over HTTP: {with_memory:.1f} with state, {without_memory:.1f} reset every step")
