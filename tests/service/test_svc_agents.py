"""A policy set served in process: many agents per act request, each mapped to its policy,
per-agent state for a whole episode, and the episode's lifecycle routes.

The set has a feed-forward policy (``ff``: the ``mlp`` bundle) and a recurrent one (``rnn``:
the ``lstm`` bundle); each answer is checked against the member model answering the same
agent's rows as an ordinary single-policy session, so the set adds routing and nothing else.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from conftest import TEAM_MAPPING, error_of

pytestmark = pytest.mark.asyncio

@pytest.fixture
def client_of(make_client, team_set):
    def make(**settings):
        return make_client(("mlp",), policy_sets=[str(team_set)], **settings)
    return make


def _obs(rng: np.random.Generator) -> list[float]:
    return rng.uniform(-1, 1, 4).round(4).tolist()


async def _act(client, body: dict) -> dict:
    response = await client.post("/v1/models/team/agents/act", json=body)
    assert response.status_code == 200, response.text
    return response.json()


async def test_each_agent_is_answered_by_its_policy_as_the_member_model_would(client_of):
    _, client = client_of()
    rng = np.random.default_rng(0)
    agents = ["red_1", "blue_1", "boss", "blue_2"]
    for step in range(5):
        observations = {agent: _obs(rng) for agent in agents}
        body = {"episode_id": "m1", "episode_start": step == 0, "explore": False, "outputs": ["value"],
                "agents": {agent: {"observation": obs, **({"reward": 0.5} if step else {})}
                           for agent, obs in observations.items()}}
        answer = await _act(client, body)
        assert list(answer["agents"]) == agents  # in the request's order
        assert answer["episode_id"] == "m1" and answer["model"] == "team"
        for agent in agents:
            got = answer["agents"][agent]
            policy = "ff" if agent.startswith("blue") else "rnn"
            assert got["policy"] == policy
            # The same row as the member model's own session (the twin replays the episode).
            twin = {"observation": observations[agent], "session_id": f"twin-{agent}", "explore": False,
                    "outputs": ["value"], **({"reward": 0.5} if step else {"episode_start": True})}
            if policy == "ff":
                twin.pop("session_id"), twin.pop("reward", None), twin.pop("episode_start", None)
            own = (await client.post(f"/v1/models/team.{policy}/act", json=twin)).json()
            assert got["action"] == pytest.approx(own["action"], rel=1e-6)
            assert got["logp"] == pytest.approx(own["logp"], rel=1e-5)
            assert got["value"] == pytest.approx(own["value"], rel=1e-5)


async def test_the_recurrent_agents_state_is_kept_per_agent(client_of):
    _, client = client_of()
    obs = [0.1, 0.2, 0.3, 0.4]
    first = await _act(client, {"episode_id": "e", "episode_start": True, "explore": False,
                                "agents": {"red_1": {"observation": obs}, "red_2": {"observation": obs}}})
    second = await _act(client, {"episode_id": "e", "explore": False,
                                 "agents": {"red_1": {"observation": obs}, "red_2": {"observation": obs}}})
    # Same observation, same policy: equal at the start, and red_1's state moved on by itself.
    assert first["agents"]["red_1"]["action"] == first["agents"]["red_2"]["action"]
    assert second["agents"]["red_1"]["action"] != first["agents"]["red_1"]["action"]
    info = (await client.get("/v1/models/team/episodes/e")).json()
    assert info["agents"]["red_1"] == {"policy": "rnn", "model": "team.rnn", "version": "1",
                                       "session_id": "e#red_1", "steps": 2}
    assert info["steps"] == 2


async def test_an_unmapped_agent_is_refused_naming_the_agent_and_the_rules(client_of):
    _, client = client_of()
    response = await client.post("/v1/models/team/agents/act",
                                 json={"episode_id": "u", "episode_start": True,
                                       "agents": {"red_1": {"observation": [0, 0, 0, 0]},
                                                  "green_9": {"observation": [0, 0, 0, 0]}}})
    error = error_of(response)
    assert response.status_code == 400 and error["field"] == "agents.green_9"
    assert "green_9" in error["message"] and "'red_*' -> rnn" in error["message"]
    assert "no default" in error["expected"]
    # Nothing changed: the episode was not created.
    assert (await client.get("/v1/models/team/episodes/u")).status_code == 404


async def test_a_bad_row_is_named_by_its_agent_and_changes_nothing(client_of):
    _, client = client_of()
    await _act(client, {"episode_id": "b", "episode_start": True,
                        "agents": {"red_1": {"observation": [0, 0, 0, 0]}}})
    response = await client.post("/v1/models/team/agents/act", json={
        "episode_id": "b", "agents": {"red_1": {"observation": [0, 0, 0, 0]}, "blue_1": {"observation": [1, 2]}}})
    error = error_of(response)
    assert response.status_code == 422 and error["field"].startswith("agents.blue_1.observation"), error
    info = (await client.get("/v1/models/team/episodes/b")).json()
    assert info["agents"]["red_1"]["steps"] == 1 and "blue_1" not in info["agents"]


async def test_agents_join_late_finish_early_and_the_episode_end_ends_all(client_of):
    app, client = client_of()
    obs = [0.0, 0.1, 0.2, 0.3]
    await _act(client, {"episode_id": "j", "episode_start": True, "agents": {"red_1": {"observation": obs}}})
    answer = await _act(client, {"episode_id": "j", "agents": {"red_1": {"observation": obs},
                                                               "blue_1": {"observation": obs}}})
    assert set(answer["agents"]) == {"red_1", "blue_1"}  # blue_1 joined
    answer = await _act(client, {"episode_id": "j", "agents": {"red_1": {"done": True, "reward": 1.0},
                                                               "blue_1": {"observation": obs}}})
    assert answer["agents"]["red_1"] == {"policy": "rnn", "done": True}
    assert "red_1" not in (await client.get("/v1/models/team/episodes/j")).json()["agents"]
    rnn = app.state.registry.entry("team.rnn").policy()
    assert "j#red_1" not in rnn.sessions  # its state ended
    # red_1 acting again starts afresh (a new seat), as at the episode's start.
    again = await _act(client, {"episode_id": "j", "explore": False, "agents": {"red_1": {"observation": obs}}})
    fresh = await _act(client, {"episode_id": "k", "episode_start": True, "explore": False,
                                "agents": {"red_1": {"observation": obs}}})
    assert again["agents"]["red_1"]["action"] == fresh["agents"]["red_1"]["action"]
    ended = await _act(client, {"episode_id": "j", "episode_end": True, "agents": {"blue_1": {"observation": obs}}})
    assert ended["episode_ended"] is True and "action" in ended["agents"]["blue_1"]
    assert "j#red_1" not in rnn.sessions
    response = await client.post("/v1/models/team/agents/act",
                                 json={"episode_id": "j", "agents": {"red_1": {"observation": obs}}})
    assert response.status_code == 410 and error_of(response)["field"] == "episode_id"


async def test_a_seeded_episode_replays_and_stateless_agents_need_no_episode(client_of):
    _, client = client_of()
    rng = np.random.default_rng(3)
    steps = [{agent: _obs(rng) for agent in ("red_1", "blue_1")} for _ in range(4)]

    async def play(episode_id: str) -> list:
        out = []
        for i, observations in enumerate(steps):
            answer = await _act(client, {"episode_id": episode_id, "episode_start": i == 0, "seed": 11,
                                         "agents": {a: {"observation": o} for a, o in observations.items()}})
            out.append({a: (v["action"], v["logp"]) for a, v in answer["agents"].items()})
        return out

    assert await play("s1") == await play("s2")
    stateless = await _act(client, {"explore": False, "agents": {"red_1": {"observation": steps[0]["red_1"]}}})
    assert "episode_id" not in stateless and stateless["agents"]["red_1"]["policy"] == "rnn"


async def test_requests_of_many_clients_share_the_policies_batches(client_of):
    app, client = client_of(max_batch_delay_ms=30.0)
    obs = [0.1, 0.1, 0.1, 0.1]
    bodies = [{"agents": {f"blue_{c}_{i}": {"observation": obs} for i in range(4)}} for c in range(3)]
    answers = await asyncio.gather(*(_act(client, body) for body in bodies))
    assert all(len(a["agents"]) == 4 for a in answers)
    metrics = (await client.get("/metrics")).text
    # 3 clients x 4 agents of one policy: one batch of the 3 requests.
    assert 'rlserve_batch_size_requests_count{model="team.ff"} 1.0' in metrics
    assert 'rlserve_batch_size_requests_sum{model="team.ff"} 3.0' in metrics
    assert 'rlserve_batch_size_rows_sum{model="team.ff"} 12.0' in metrics


async def test_episode_routes_create_export_import_end(client_of):
    app, client = client_of()
    created = await client.post("/v1/models/team/episodes", json={"episode_id": "x", "seed": 5})
    assert created.status_code == 201 and created.json()["seed"] == 5
    obs = [0.3, 0.2, 0.1, 0.0]
    await _act(client, {"episode_id": "x", "agents": {"red_1": {"observation": obs}, "blue_1": {"observation": obs}}})
    exported = await client.get("/v1/models/team/episodes/x", headers={"accept": "application/octet-stream"})
    assert exported.status_code == 200
    imported = await client.put("/v1/models/team/episodes/y", content=exported.content,
                                headers={"content-type": "application/octet-stream"})
    assert imported.status_code == 200, imported.text
    assert imported.json()["agents"]["red_1"]["session_id"] == "y#red_1"
    # The copy continues exactly where the original is.
    a = await _act(client, {"episode_id": "x", "explore": False, "agents": {"red_1": {"observation": obs}}})
    b = await _act(client, {"episode_id": "y", "explore": False, "agents": {"red_1": {"observation": obs}}})
    assert a["agents"]["red_1"]["action"] == b["agents"]["red_1"]["action"]
    ended = await client.delete("/v1/models/team/episodes/x")
    assert ended.status_code == 200 and set(ended.json()["agents"]) == {"red_1", "blue_1"}
    assert (await client.get("/v1/models/team/episodes/x")).status_code == 410
    bad = await client.put("/v1/models/team/episodes/z", content=b"nope",
                           headers={"content-type": "application/octet-stream"})
    assert bad.status_code == 422 and error_of(bad)["field"] == "body"


async def test_metadata_shows_the_mapping_and_each_policy_is_its_own_model(client_of):
    _, client = client_of()
    meta = (await client.get("/v1/models/team")).json()
    assert meta["kind"] == "policy_set" and meta["mapping"] == TEAM_MAPPING.to_json()
    assert meta["policies"]["rnn"]["model"] == "team.rnn" and meta["policies"]["rnn"]["recurrent"] is True
    listing = (await client.get("/v1/models")).json()
    assert {"name": "team", "version": "1", "policies": {"ff": "team.ff", "rnn": "team.rnn"}} in listing["policy_sets"]
    assert {m["name"] for m in listing["models"]} >= {"team.ff", "team.rnn"}
    # The Open Inference Protocol addresses each policy of the set as a model of its own.
    ready = await client.get("/v2/models/team.ff/ready")
    assert ready.status_code == 200
    infer = await client.post("/v2/models/team.ff/infer", json={"inputs": [
        {"name": "obs", "shape": [1, 4], "datatype": "FP32", "data": [0.1, 0.2, 0.3, 0.4]}]})
    assert infer.status_code == 200, infer.text
    # A single-policy request to the set's name says where to go.
    response = await client.post("/v1/models/team/act", json={"observation": [0, 0, 0, 0]})
    assert response.status_code == 404 and "agents/act" in error_of(response)["message"]


async def test_a_refused_import_leaves_the_episode_it_would_replace_as_it_was(client_of):
    """An export whose second agent's record is damaged is refused (422) before any agent's
    state is written: the live episode of that id exports the same bytes afterwards."""
    import msgspec

    _, client = client_of()
    octet = {"accept": "application/octet-stream"}
    obs = [0.3, 0.2, 0.1, 0.0]
    for episode, steps in (("x", 2), ("y", 4)):  # the same agents, different states
        for t in range(steps):
            await _act(client, {"episode_id": episode, "episode_start": t == 0, "seed": 3,
                                "agents": {"red_1": {"observation": obs}, "blue_1": {"observation": obs}}})
    before = (await client.get("/v1/models/team/episodes/x", headers=octet)).content
    other = msgspec.msgpack.decode((await client.get("/v1/models/team/episodes/y", headers=octet)).content)
    assert list(other["records"]) == ["red_1", "blue_1"]  # red_1's record is imported first
    other["records"]["blue_1"] = other["records"]["blue_1"][:-7]
    refused = await client.put("/v1/models/team/episodes/x", content=msgspec.msgpack.encode(other),
                               headers={"content-type": "application/octet-stream"})
    assert refused.status_code == 422 and error_of(refused)["field"] == "body.records.blue_1"
    after = (await client.get("/v1/models/team/episodes/x", headers=octet)).content
    assert _without_export_times(after) == _without_export_times(before)


async def test_an_import_over_an_agent_session_in_flight_is_refused_before_anything_is_written(client_of):
    """An agent's session is an ordinary session of its member model, which a client can
    step directly: while it has a request in flight, an import of its episode is a 409
    naming that agent, and no other agent's state was replaced (the batch would otherwise
    write into a slot the import gave away). Once answered, the same import goes through."""
    import msgspec

    from rlserve.service.sessions.episode_store import agent_session_id

    app, client = client_of()
    octet = {"accept": "application/octet-stream"}
    obs = [0.3, 0.2, 0.1, 0.0]
    for episode, steps in (("x", 2), ("y", 4)):
        for t in range(steps):
            await _act(client, {"episode_id": episode, "episode_start": t == 0, "seed": 3,
                                "agents": {"red_1": {"observation": obs}, "blue_1": {"observation": obs}}})
    before = (await client.get("/v1/models/team/episodes/x", headers=octet)).content
    other = (await client.get("/v1/models/team/episodes/y", headers=octet)).content
    assert list(msgspec.msgpack.decode(other)["records"]) == ["red_1", "blue_1"]  # red_1 would be written first
    held = app.state.registry.entry("team.ff").policy().sessions.live(agent_session_id("x", "blue_1"))
    held.inflight += 1  # as while a request of team.ff for that session is in its batch
    try:
        refused = await client.put("/v1/models/team/episodes/x", content=other,
                                   headers={"content-type": "application/octet-stream"})
    finally:
        held.inflight -= 1
    assert refused.status_code == 409 and error_of(refused)["field"] == "body.records.blue_1", refused.text
    after = (await client.get("/v1/models/team/episodes/x", headers=octet)).content
    assert _without_export_times(after) == _without_export_times(before)
    taken = await client.put("/v1/models/team/episodes/x", content=other,
                             headers={"content-type": "application/octet-stream"})
    assert taken.status_code == 200, taken.text
    imported = (await client.get("/v1/models/team/episodes/x", headers=octet)).content
    assert _without_export_times(imported)["records"] == _without_export_times(other)["records"]


async def test_an_episode_import_checks_what_each_agent_record_holds(client_of):
    """An agent's record whose state is NaN (every later step of the agent was a 500), and
    an agent id longer than a request may send (it was stored and echoed whole): both 422,
    the first naming the agent's record."""
    import msgspec

    from rlserve.service.sessions.record import HEADER_BYTES, read_header

    _, client = client_of()
    octet = {"accept": "application/octet-stream"}
    await _act(client, {"episode_id": "n", "episode_start": True,
                        "agents": {"red_1": {"observation": [0.1, 0.2, 0.3, 0.4]}}})
    body = msgspec.msgpack.decode((await client.get("/v1/models/team/episodes/n", headers=octet)).content)
    record = body["records"]["red_1"]
    state = HEADER_BYTES + int(read_header(record)["version_len"])  # the lstm's h state comes first
    nan = dict(body, records={"red_1": record[:state] + np.float32("nan").tobytes() + record[state + 4:]})
    refused = await client.put("/v1/models/team/episodes/m", content=msgspec.msgpack.encode(nan),
                               headers={"content-type": "application/octet-stream"})
    assert refused.status_code == 422 and error_of(refused)["field"] == "body.records.red_1", refused.text
    long_id = "red_" + "x" * 70
    renamed = dict(body, seats={long_id: body["seats"]["red_1"]}, joins={long_id: 1}, records={long_id: record})
    refused = await client.put("/v1/models/team/episodes/m", content=msgspec.msgpack.encode(renamed),
                               headers={"content-type": "application/octet-stream"})
    assert refused.status_code == 422 and "agent id" in error_of(refused)["message"], refused.text
    assert (await client.get("/v1/models/team/episodes/m")).status_code == 404
    taken = await client.put("/v1/models/team/episodes/m", content=msgspec.msgpack.encode(body),
                             headers={"content-type": "application/octet-stream"})
    assert taken.status_code == 200, taken.text

def _without_export_times(exported: bytes) -> dict:
    """An episode export, each agent's record without its "created" (bytes 24-32: a wall
    time the export computes, so two exports of one state differ there)."""
    import msgspec

    body = msgspec.msgpack.decode(exported)
    body["records"] = {agent: record[:24] + record[32:] for agent, record in body["records"].items()}
    return body
