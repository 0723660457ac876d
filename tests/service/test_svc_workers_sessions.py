"""`rlserve serve --workers N` without a session store: every request that names a session or
an episode answers what creating one answers, 503 ``sessions_unavailable`` naming
RLSERVE_SESSION_STORE, never a 404 telling the client to create what cannot be created.

The app is built as each worker builds it (``Settings(workers=2)``), in process.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import error_of

from rlserve.models.export.policy_set_export import policy_set_from_bundles
from rlserve.models.multiagent.mapping import AgentMapping

pytestmark = pytest.mark.asyncio

OBS = [0.1, -0.2, 0.3, 0.0]


def _refused(response, field: str) -> None:
    assert response.status_code == 503, response.text
    error = error_of(response)
    assert error["code"] == "sessions_unavailable" and "RLSERVE_SESSION_STORE" in error["message"], error
    assert error["field"] == field and error["received"] == "e1", error


async def test_a_session_id_answers_what_creating_it_answers(make_client):
    _, client = make_client(("lstm",), workers=2)
    _refused(await client.post("/v1/models/lstm/sessions", json={"session_id": "e1"}), "session_id")
    _refused(await client.post("/v1/models/lstm/act", json={"observation": OBS, "session_id": "e1"}), "session_id")
    _refused(await client.get("/v1/models/lstm/sessions/e1"), "session_id")
    _refused(await client.delete("/v1/models/lstm/sessions/e1"), "session_id")
    stateless = await client.post("/v1/models/lstm/act", json={"observation": OBS})
    assert stateless.status_code == 200, stateless.text


async def test_a_sequence_answers_503_in_the_protocols_shape(make_client):
    _, client = make_client(("lstm",), workers=2)
    body = {"parameters": {"sequence_id": "e1"},
            "inputs": [{"name": "obs", "shape": [1, 4], "datatype": "FP32", "data": OBS}]}
    response = await client.post("/v2/models/lstm/infer", json=body)
    assert response.status_code == 503, response.text
    assert "RLSERVE_SESSION_STORE" in response.json()["error"]


async def test_an_episode_id_answers_what_creating_it_answers(make_client, bundle_store, tmp_path: Path):
    mapping = AgentMapping({}, [], "ff")
    with policy_set_from_bundles({"ff": bundle_store / "mlp"}, tmp_path / "team", mapping, name="team"):
        pass
    _, client = make_client(("mlp",), workers=2, policy_sets=[str(tmp_path / "team")])
    _refused(await client.post("/v1/models/team/episodes", json={"episode_id": "e1"}), "episode_id")
    act = {"episode_id": "e1", "agents": {"a": {"observation": OBS}}}
    _refused(await client.post("/v1/models/team/agents/act", json=act), "episode_id")
    _refused(await client.get("/v1/models/team/episodes/e1"), "episode_id")
    _refused(await client.delete("/v1/models/team/episodes/e1"), "episode_id")
