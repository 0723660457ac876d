"""The experience log of a policy set: each agent of a multi-agent episode is written as a
single-agent episode of its own (RLlib's offline reader takes no multi-agent episodes), in
its policy's member model (``<set>.<policy_id>``), with ``agent_id`` and ``module_id`` filled.

An agent's episode closes when it is sent ``done`` with its last observation (and the reward
that came with it): terminated, or ``truncated``; that step is answered ``done`` and the
agent's state ends after it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import error_of

from rlserve.models.export.policy_set_export import policy_set_from_bundles
from rlserve.models.multiagent.mapping import AgentMapping
from rlserve.service.experience import reader

pytestmark = pytest.mark.asyncio

ROUTE = "/v1/models/squad/agents/act"


@pytest.fixture(scope="module")
def squad(bundle_store, tmp_path_factory) -> Path:
    """Two policies: ``scout`` (the mlp bundle, Discrete(3)) for ``scout_*`` agents, ``leader``
    (the lstm bundle, Box(2)) for everyone else."""
    out = tmp_path_factory.mktemp("sets") / "squad"
    mapping = AgentMapping({}, [("scout_*", "scout")], "leader")
    with policy_set_from_bundles({"scout": bundle_store / "mlp", "leader": bundle_store / "lstm"}, out, mapping,
                                 name="squad"):
        pass
    return out


def _obs(rng: np.random.Generator) -> list[float]:
    return rng.uniform(-1, 1, 4).astype(np.float32).tolist()


async def _act(client, body: dict) -> dict:
    response = await client.post(ROUTE, json=body)
    assert response.status_code == 200, response.text
    return response.json()


async def test_each_agent_is_its_own_episode_with_its_agent_and_module_id(make_client, squad, tmp_path):
    log = tmp_path / "log"
    app, client = make_client(("mlp",), policy_sets=[str(squad)], experience_log=log)
    rng = np.random.default_rng(3)
    agents = ["scout_1", "scout_2", "boss"]
    sent: dict[str, list[list[float]]] = {a: [] for a in agents}  # each agent's observations, in order
    served: dict[str, list[dict]] = {a: [] for a in agents}  # each agent's answers (its steps)
    rewards: dict[str, list[float]] = {a: [] for a in agents}
    playing = list(agents)
    for step in range(6):
        last = step == 5
        body: dict = {"episode_id": "raid", "episode_start": step == 0, "explore": True, "agents": {}}
        for agent in playing:
            obs = _obs(rng)
            sent[agent].append(obs)
            one: dict = {"observation": obs}
            if step:
                reward = round(float(rng.uniform(-1, 1)), 3)
                rewards[agent].append(reward)
                one["reward"] = reward
            # scout_2 terminates after 2 steps; at the end boss is cut by a time limit, scout_1 terminates.
            if (agent == "scout_2" and step == 2) or last:
                one["done"] = True
                if agent == "boss":
                    one["truncated"] = True
            body["agents"][agent] = one
        body["episode_end"] = last
        answer = await _act(client, body)
        for agent, got in answer["agents"].items():
            if body["agents"][agent].get("done"):
                assert got == {"policy": "scout" if agent.startswith("scout") else "leader", "done": True}
                playing.remove(agent)
            else:
                assert isinstance(got["event_id"], str)  # a logged step carries its event id
                served[agent].append(got)
        if step == 2:  # scout_2's state ended with its last observation
            info = (await client.get("/v1/models/squad/episodes/raid")).json()
            assert sorted(info["agents"]) == ["boss", "scout_1"]
    assert answer["episode_ended"] is True
    app.state.experience.close()

    scouts, leaders = reader.episodes(log, "squad.scout"), reader.episodes(log, "squad.leader")
    assert sorted((e.agent_id, e.module_id) for e in scouts) == [("scout_1", "scout"), ("scout_2", "scout")]
    assert [(e.agent_id, e.module_id) for e in leaders] == [("boss", "leader")]
    by_agent = {e.agent_id: e for e in scouts + leaders}
    ends = {"scout_1": (True, False), "scout_2": (True, False), "boss": (False, True)}
    for agent, episode in by_agent.items():
        assert episode.whole and (episode.is_terminated, episode.is_truncated) == ends[agent]
        assert episode.eps_id.startswith(f"raid#{agent}:")  # one episode per agent, never shared
        assert len(episode) == len(served[agent]) == len(sent[agent]) - 1
        np.testing.assert_array_equal(np.stack(episode.observations), np.array(sent[agent], np.float32))
        assert episode.rewards == pytest.approx(rewards[agent])
        assert episode.event_ids == [got["event_id"] for got in served[agent]]
        assert episode.action_logp == pytest.approx([got["logp"] for got in served[agent]], rel=1e-6)
        actions = np.asarray([got["action"] for got in served[agent]], dtype=np.float64)
        np.testing.assert_allclose(np.asarray(episode.actions, dtype=np.float64), actions, rtol=1e-6)

    table = reader.transitions(log, "squad.scout")
    assert table is not None and table.num_rows == len(served["scout_1"]) + len(served["scout_2"])
    rows = table.select(["eps_id", "agent_id", "module_id", "t", "terminateds"]).to_pylist()
    assert {(r["agent_id"], r["module_id"]) for r in rows} == {("scout_1", "scout"), ("scout_2", "scout")}
    assert all(r["eps_id"].startswith(f"raid#{r['agent_id']}:") for r in rows)
    assert sum(r["terminateds"] for r in rows) == 2  # each scout's last transition


async def test_a_single_policy_session_of_a_member_has_no_agent(make_client, squad, tmp_path):
    log = tmp_path / "log"
    app, client = make_client(("mlp",), policy_sets=[str(squad)], experience_log=log)
    rng = np.random.default_rng(4)
    for t in range(3):
        body: dict = {"observation": _obs(rng), "session_id": "solo", **({"reward": 1.0} if t else
                                                                         {"episode_start": True})}
        if t == 2:
            body["terminated"] = True
        assert (await client.post("/v1/models/squad.scout/act", json=body)).status_code == 200
    app.state.experience.close()
    (episode,) = reader.episodes(log, "squad.scout")
    assert len(episode) == 2 and (episode.agent_id, episode.module_id) == (None, None)


async def test_truncated_needs_done_and_the_last_observation(make_client, squad, tmp_path):
    _, client = make_client(("mlp",), policy_sets=[str(squad)], experience_log=tmp_path / "log")
    obs = [0.0, 0.1, 0.2, 0.3]
    await _act(client, {"episode_id": "t", "episode_start": True, "agents": {"scout_1": {"observation": obs}}})
    for step in ({"observation": obs, "truncated": True}, {"done": True, "truncated": True}):
        response = await client.post(ROUTE, json={"episode_id": "t", "agents": {"scout_1": step}})
        error = error_of(response)
        assert response.status_code == 400 and error["field"] == "agents.scout_1.truncated", error
    # Refused without a change: scout_1 still has its state, and a plain done still ends it.
    info = (await client.get("/v1/models/squad/episodes/t")).json()
    assert info["agents"]["scout_1"]["steps"] == 1
    answer = await _act(client, {"episode_id": "t", "agents": {"scout_1": {"done": True}}})
    assert answer["agents"]["scout_1"] == {"policy": "scout", "done": True}
