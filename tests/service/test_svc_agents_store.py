"""Multi-agent episodes in the external store (a real redis-server): durable, movable between
replicas, exported and imported, ended for good; the same answers as one process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import error_of

from rlserve.models.export.policy_set_export import policy_set_from_bundles
from rlserve.models.multiagent.mapping import AgentMapping

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module")
def team_set(bundle_store, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sets") / "team"
    with policy_set_from_bundles({"ff": bundle_store / "mlp", "rnn": bundle_store / "lstm"}, out,
                                 AgentMapping({}, [("red_*", "rnn")], "ff"), name="team"):
        pass
    return out


def _steps(seed: int, n: int) -> list[dict]:
    """An episode where blue_1 joins at step 2 and red_2 finishes at step 3."""
    rng = np.random.default_rng(seed)
    steps = []
    for t in range(n):
        agents = {"red_1": {}, **({"red_2": {}} if t < 3 else {}), **({"blue_1": {}} if t >= 2 else {})}
        for agent in agents:
            agents[agent] = {"observation": rng.uniform(-1, 1, 4).round(3).tolist(), **({"reward": 0.25} if t else {})}
        if t == 3:
            agents["red_2"] = {"done": True, "reward": 1.0}
        steps.append({"episode_id": "ep", "episode_start": t == 0, "seed": 9 if t == 0 else None, "agents": agents})
    return [{k: v for k, v in body.items() if v is not None} for body in steps]


async def _play(clients: list, bodies: list[dict]) -> list[dict]:
    answers = []
    for t, body in enumerate(bodies):
        response = await clients[t % len(clients)].post("/v1/models/team/agents/act", json=body)
        assert response.status_code == 200, response.text
        answers.append({a: (v.get("action"), v.get("logp"), v["policy"]) for a, v in response.json()["agents"].items()})
    return answers


async def test_replicas_taking_turns_answer_as_one_process(make_client, redis_server, team_set):
    bodies = _steps(1, 7)
    _, reference = make_client((), policy_sets=[str(team_set)])
    expected = await _play([reference], bodies)
    store = {"session_store": redis_server.url, "policy_sets": [str(team_set)]}
    _, a = make_client((), **store)
    _, b = make_client((), **store)
    assert await _play([a, b], bodies) == expected  # each step on the other replica
    info = (await a.get("/v1/models/team/episodes/ep")).json()
    assert set(info["agents"]) == {"red_1", "blue_1"} and info["agents"]["red_1"]["steps"] == 7
    keys = {k.decode() for k in redis_server.client().keys("*")}
    assert any(k.endswith(":team:ep") and ":e:" in k for k in keys), keys  # the episode's own record
    assert any(k.endswith("team.rnn:ep#red_1") for k in keys), keys  # each agent a session of its policy


async def test_a_restarted_replica_continues_and_the_end_is_final(make_client, redis_server, team_set):
    bodies = _steps(2, 6)
    _, reference = make_client((), policy_sets=[str(team_set)])
    expected = await _play([reference], bodies)
    store = {"session_store": redis_server.url, "policy_sets": [str(team_set)]}
    _, before = make_client((), **store)
    assert await _play([before], bodies[:4]) == expected[:4]
    _, after = make_client((), **store)  # a new process: nothing held
    assert await _play([after], bodies[4:]) == expected[4:]
    exported = await after.get("/v1/models/team/episodes/ep", headers={"accept": "application/octet-stream"})
    put = await before.put("/v1/models/team/episodes/copy", content=exported.content,
                           headers={"content-type": "application/octet-stream"})
    assert put.status_code == 200, put.text
    ended = await before.delete("/v1/models/team/episodes/ep")
    assert ended.status_code == 200
    gone = {"episode_id": "ep", "agents": {"red_1": {"observation": [0, 0, 0, 0]}}}
    response = await before.post("/v1/models/team/agents/act", json=gone)
    assert response.status_code == 410 and error_of(response)["field"] == "episode_id"
    # The other replica's copy learns it from the agent's state (gone from the store), then
    # reads the episode again: its tombstone.
    response = await after.post("/v1/models/team/agents/act", json=gone)
    assert response.status_code == 410 and error_of(response)["field"] == "session_id"
    response = await after.post("/v1/models/team/agents/act", json=gone)
    assert response.status_code == 410 and error_of(response)["field"] == "episode_id"
    # The imported copy lives on, on either replica.
    copy = await after.post("/v1/models/team/agents/act",
                            json={"episode_id": "copy", "agents": {"red_1": {"observation": [0, 0, 0, 0]}}})
    assert copy.status_code == 200, copy.text


@pytest.mark.parametrize("store", ["in-process", "redis"])
async def test_an_ended_episode_id_starts_a_new_episode(make_client, redis_server, team_set, store):
    """Once an episode ended (``episode_end``), ``episode_start`` with its id starts a new one:
    with the same seed, it answers as the first did (its agents' old states are gone)."""
    bodies = _steps(3, 4)
    bodies[-1]["episode_end"] = True
    settings = {"session_store": redis_server.url} if store == "redis" else {}
    _, client = make_client((), policy_sets=[str(team_set)], **settings)
    first = await _play([client], bodies)
    assert await _play([client], bodies) == first
    gone = await client.get("/v1/models/team/episodes/ep")
    assert gone.status_code == 410
