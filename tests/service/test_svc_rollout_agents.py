"""A traffic split on a policy set's member: each multi-agent episode draws once per member
model, every agent of that member in the episode is on one version, and agents joining
later (even after the weights changed) join their member's version. In process, real
ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from bundle_edits import edited_copy

from rlserve.models.export.policy_set_export import policy_set_from_bundles
from rlserve.models.multiagent.mapping import AgentMapping
from rlserve.models.multiagent.policy_set import MEMBERS_DIR
from rlserve.service.app import DEFAULT_MODELS, create_app
from rlserve.service.sessions.episode_store import agent_session_id
from rlserve.service.settings import Settings

pytestmark = pytest.mark.asyncio

MAPPING = AgentMapping({}, [("blue_*", "ff")], "ff")
EPISODES = 40


@pytest.fixture(scope="module")
def blue_set(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sets") / "blue"
    with policy_set_from_bundles({"ff": DEFAULT_MODELS / "cartpole"}, out, MAPPING, name="blue"):
        pass
    return out


def _versions(registry, episode: str, agents: list[str]) -> set[str]:
    lifecycle = registry.entry("blue.ff").sessions
    return {lifecycle.find(agent_session_id(episode, agent)).version for agent in agents}


async def test_a_member_draws_once_per_episode_and_late_agents_join_its_draw(blue_set, tmp_path):
    app = create_app(Settings(policy_sets=[str(blue_set)]))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    registry = app.state.registry
    member = next((blue_set / MEMBERS_DIR).iterdir())
    registry.add(registry.load_policy(edited_copy(member, tmp_path / "ff-2", lambda data: data.update(name="blue.ff"))))
    registry.entry("blue.ff").traffic.set_weights({"1": 50, "2": 50}, "test")
    obs = [0.01, -0.02, 0.03, 0.04]
    drawn = []
    for k in range(EPISODES):
        episode = f"ep-{k}"
        first = {"blue_1": {"observation": obs}, "blue_2": {"observation": obs}}
        reply = await client.post("/v1/models/blue/agents/act",
                                  json={"episode_id": episode, "episode_start": True, "agents": first})
        assert reply.status_code == 200, reply.text
        [version] = _versions(registry, episode, ["blue_1", "blue_2"])
        drawn.append(version)
        # The weights flip: blue_3 joins alone (its member's other agents are live, not in this step).
        registry.entry("blue.ff").traffic.set_weights({"1": 0, "2": 100} if version == "1" else {"1": 100, "2": 0},
                                                      "test flips")
        reply = await client.post("/v1/models/blue/agents/act",
                                  json={"episode_id": episode, "agents": {"blue_3": {"observation": obs}}})
        assert reply.status_code == 200, reply.text
        assert _versions(registry, episode, ["blue_1", "blue_2", "blue_3"]) == {version}
        registry.entry("blue.ff").traffic.set_weights({"1": 50, "2": 50}, "test")
    # Binomial(40, 0.5): both versions drawn (all on one: 2 * 0.5**40).
    assert set(drawn) == {"1", "2"}
    # Each step's part of the member is one request of its version (two steps per episode).
    summary = registry.live.summary("blue.ff", ["1", "2"])
    assert {v: summary[v]["requests"] for v in ("1", "2")} == {v: 2 * drawn.count(v) for v in ("1", "2")}
