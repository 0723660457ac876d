"""A multi-policy RLlib checkpoint served as a policy set answers every agent as RLlib did.

For every multi-agent case (``checkpoint_cases.multi_agent_case_ids``; written by
``scripts/record_rllib_multiagent.py``), the server is started on the checkpoint itself
(``policy_sets`` + the case's mapping as ``agent_mapping``: every policy exported at start,
each verified), and asked over HTTP (the app's ASGI interface):

- ``fixed``: each policy's recorded observations, one stateless agent each, ``explore=false``;
- ``episodes``: whole recorded episodes, every step one ``agents/act`` request for all the
  agents acting then, in one episode (per-agent recurrent state kept by the server), with
  each agent's reward since its last action as RLlib's sampler fed it.

Deterministic actions equal RLlib's; ``logp``, ``dist_inputs`` and ``value`` within 1e-5
relative (1e-5 absolute near zero, as ``test_checkpoints.py``); the recurrent policy's
state after every step against ``episode_states.npz`` (read back through the episode's
export).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import numpy as np
import pytest
from checkpoint_cases import case_path, multi_agent_case_ids

from rlserve.service.app import create_app
from rlserve.service.sessions.episode_record import decode_episode
from rlserve.service.settings import Settings

RTOL = ATOL = 1e-5
CASES = multi_agent_case_ids()


def test_there_is_a_multi_agent_case() -> None:
    assert CASES, "tests/fixtures/checkpoints holds no multi-agent case (scripts/record_rllib_multiagent.py)"


@pytest.fixture(scope="module", params=CASES)
def case(request) -> dict[str, Any]:
    path = case_path(request.param)
    return {"path": path, "reference": json.loads((path / "reference.json").read_text()),
            "states": dict(np.load(path / "episode_states.npz"))}


@pytest.fixture
def client(case, tmp_path):
    (tmp_path / "repo").mkdir()
    settings = Settings(repository=tmp_path / "repo", policy_sets=[f"game={case['path'] / 'checkpoint'}"],
                        agent_mapping=case["reference"]["mapping"])
    app = create_app(settings)
    assert not app.state.registry.failures, app.state.registry.failures
    case["app"] = app
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def _close(actual: Any, expected: Any, what: str) -> None:
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64), rtol=RTOL,
                               atol=ATOL, err_msg=what)


async def _act(client: httpx.AsyncClient, body: dict) -> dict:
    response = await client.post("/v1/models/game/agents/act", json=body)
    assert response.status_code == 200, response.text
    return response.json()["agents"]


@pytest.mark.asyncio
async def test_fixed_answers_of_every_policy(case, client) -> None:
    agent_of = {policy: agent for agent, policy in case["reference"]["mapping"]["agents"].items()}
    for policy, fixed in case["reference"]["fixed"].items():
        for i, obs in enumerate(fixed["obs"]):
            got = (await _act(client, {"explore": False, "outputs": ["dist_inputs", "value"],
                                       "agents": {agent_of[policy]: {"observation": obs}}}))[agent_of[policy]]
            what = f"{policy} fixed[{i}]"
            assert got["policy"] == policy and got["action"] == fixed["action"][i], what
            _close(got["logp"], fixed["logp"][i], f"{what} logp")
            _close(got["dist_inputs"], fixed["dist_inputs"][i], f"{what} dist_inputs")
            _close(got["value"], fixed["value"][i], f"{what} value")


@pytest.mark.asyncio
async def test_whole_recorded_episodes_agent_by_agent(case, client) -> None:
    recurrent = {pid for pid, p in case["reference"]["policies"].items() if p["recurrent"]}
    assert recurrent and len(recurrent) < len(case["reference"]["policies"])  # one recurrent, one not
    for number, episode in enumerate(case["reference"]["episodes"]):
        episode_id = f"episode-{number}"
        for t, step in enumerate(episode["steps"]):
            agents = {agent: {"observation": rec["obs"], **({"reward": rec["prev_reward"]} if t else {})}
                      for agent, rec in step.items()}
            got = await _act(client, {"episode_id": episode_id, "episode_start": t == 0, "explore": False,
                                      "outputs": ["dist_inputs", "value"], "agents": agents})
            for agent, rec in step.items():
                what = f"episode {number} step {t} {agent}"
                assert got[agent]["policy"] == rec["policy"], what
                assert got[agent]["action"] == rec["action"], what
                _close(got[agent]["logp"], rec["logp"], f"{what} logp")
                _close(got[agent]["dist_inputs"], rec["dist_inputs"], f"{what} dist_inputs")
                _close(got[agent]["value"], rec["value"], f"{what} value")
                if rec["policy"] in recurrent:
                    await _check_state(client, case, episode_id, number, agent, t)
        ended = await client.delete(f"/v1/models/game/episodes/{episode_id}")
        assert ended.status_code == 200 and set(ended.json()["agents"]) == set(episode["steps"][0])


async def _check_state(client: httpx.AsyncClient, case: dict, episode_id: str, number: int, agent: str,
                       t: int) -> None:
    """The agent's recurrent state after step ``t``, as the server holds it, against RLlib's."""
    exported = await client.get(f"/v1/models/game/episodes/{episode_id}",
                                headers={"accept": "application/octet-stream"})
    seats = decode_episode(exported.content)
    policy = case["app"].state.registry.entry(f"game.{seats.seats[agent].policy}").policy()
    rows = policy.sessions.layout.decode(seats.records[agent]).rows  # the state tensors first (h, c)
    for i in range(2):
        _close(rows[i], case["states"][f"episode_{number}/{agent}/state_out/{i}"][t],
               f"episode {number} step {t} {agent} state {i}")
