"""A policy set's stream in process: ``/v1/models/{set}/agents/stream`` plays the same
episode as ``POST /v1/models/{set}/agents/act``, pipelines in order, refuses with error
frames and stays open, ends its episode, and ``/metrics`` counts it while it is open.

The app is the real one (real batches, real sessions, the set of the ``mlp`` and ``lstm``
bundles of ``test_svc_agents``); the socket is an ASGI receive/send pair of queues.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgpack
import numpy as np
import pytest

from rlserve.client.stream import pack_array

pytestmark = pytest.mark.asyncio

@pytest.fixture
def served(make_client, team_set):
    return make_client(("mlp",), policy_sets=[str(team_set)])


class Socket:
    """One WebSocket connection to the app, driven through ASGI."""

    def __init__(self, app: Any, path: str, query: bytes = b"", binary: bool = False):
        self.incoming: asyncio.Queue[dict] = asyncio.Queue()
        self.outgoing: asyncio.Queue[dict] = asyncio.Queue()
        self.binary = binary
        self.incoming.put_nowait({"type": "websocket.connect"})
        scope = {"type": "websocket", "path": path, "query_string": query, "headers": [],
                 "extensions": {"websocket.http.response": {}}}
        match = app.stream.match(scope)
        assert match is not None
        self.task = asyncio.create_task(app.stream(scope, self.incoming.get, self.outgoing.put, match))

    async def first(self) -> dict:
        return await asyncio.wait_for(self.outgoing.get(), 10)

    def send(self, message: dict) -> None:
        if self.binary:
            self.incoming.put_nowait({"type": "websocket.receive", "bytes": msgpack.packb(message,
                                                                                        default=pack_array)})
        else:
            self.incoming.put_nowait({"type": "websocket.receive", "text": json.dumps(message)})

    async def receive(self) -> dict:
        message = await asyncio.wait_for(self.outgoing.get(), 10)
        assert message["type"] == "websocket.send", message
        if self.binary:
            return msgpack.unpackb(message["bytes"])
        return json.loads(message["text"])

    async def leave(self) -> None:
        self.incoming.put_nowait({"type": "websocket.disconnect", "code": 1000})
        await asyncio.wait_for(self.task, 10)


def _script(seed: int) -> list[dict[str, dict]]:
    """An episode's agent steps: agents joining late, one finishing with its last observation."""
    rng = np.random.default_rng(seed)

    def obs() -> list[float]:
        return rng.uniform(-1, 1, 4).round(4).tolist()

    steps: list[dict[str, dict]] = [{"red_1": {"observation": obs()}, "blue_1": {"observation": obs()}}]
    for i in range(1, 6):
        step = {"red_1": {"observation": obs(), "reward": 0.1 * i}, "blue_1": {"observation": obs(), "reward": 1.0}}
        if i >= 2:
            step["boss"] = {"observation": obs(), **({"reward": -0.5} if i > 2 else {})}
        if i == 4:
            step["blue_1"] = {"observation": obs(), "reward": 2.0, "done": True}
        if i == 5:
            step.pop("blue_1")
        steps.append(step)
    return steps


async def _over_http(client: Any, steps: list[dict], seed: int) -> list[dict]:
    answers = []
    for i, agents in enumerate(steps):
        body = {"episode_id": "http-1", "episode_start": i == 0, "seed": seed if i == 0 else None, "explore": True,
                "outputs": ["value"], "agents": agents, "episode_end": i == len(steps) - 1}
        response = await client.post("/v1/models/team/agents/act",
                                     json={k: v for k, v in body.items() if v is not None})
        assert response.status_code == 200, response.text
        answers.append(response.json()["agents"])
    return answers


@pytest.mark.parametrize("binary", [False, True], ids=["json", "msgpack"])
async def test_a_streamed_episode_equals_the_same_seeded_episode_over_http(served, binary):
    app, client = served
    steps = _script(3)
    expected = await _over_http(client, steps, seed=11)
    socket = Socket(app, "/v1/models/team/agents/stream", b"seed=11&explore=true&outputs=value", binary)
    assert (await socket.first())["type"] == "websocket.accept"
    for i, agents in enumerate(steps):  # all in flight at once: answered in order, tagged
        message: dict[str, Any] = {"agents": agents, "tag": i}
        if binary:  # the observations as numpy arrays (msgpack_numpy maps)
            message["agents"] = {a: {**s, **({"observation": np.asarray(s["observation"], np.float32)}
                                                if "observation" in s else {})} for a, s in agents.items()}
        if i == len(steps) - 1:
            message["episode_end"] = True
        socket.send(message)
    got = [await socket.receive() for _ in steps]
    assert [answer["tag"] for answer in got] == list(range(len(steps)))
    assert got[-1]["episode_ended"] is True and got[0]["model"] == "team"
    for answer, want in zip(got, expected, strict=True):
        assert list(answer["agents"]) == list(want)
        for agent, one in want.items():
            assert answer["agents"][agent]["policy"] == one["policy"]
            if "action" in one:  # the recurrent agents' seeded samples, action for action
                assert answer["agents"][agent]["action"] == pytest.approx(one["action"], rel=1e-6)
                assert answer["agents"][agent]["logp"] == pytest.approx(one["logp"], rel=1e-5)
                assert answer["agents"][agent]["value"] == pytest.approx(one["value"], rel=1e-5)
            else:
                assert answer["agents"][agent] == one
    await socket.leave()
    info = (await client.get("/v1/models/team")).json()
    assert info["episodes"]["active"] == 0  # both episodes ended with their last step


async def test_refusals_are_error_frames_and_the_stream_goes_on(served):
    app, client = served
    socket = Socket(app, "/v1/models/team/agents/stream", b"seed=1")
    await socket.first()
    socket.send({"agents": {"red_1": {"observation": [0.1, 0.2, 0.3, 0.4], "colour": 1}}, "tag": "a"})
    error = await socket.receive()
    assert error["status"] == 400 and "tag" not in error and error["error"]["field"] == "colour"
    socket.send({"agents": {"red_1": {"observation": [0.1, 0.2]}}, "tag": "b"})  # wrong size: the act path's 422
    error = await socket.receive()
    assert error["status"] == 422 and error["tag"] == "b"
    assert error["error"]["field"].startswith("agents.red_1.observation")
    socket.send({"agents": {"nobody": {"observation": [0.1, 0.2, 0.3, 0.4]}}, "tag": "c"})
    assert (await socket.receive())["error"]["field"] == "agents.nobody"
    socket.send({"tag": "d"})  # no agents
    assert (await socket.receive())["error"]["field"] == "agents"
    socket.send({"agents": {"red_1": {"observation": [0.1, 0.2, 0.3, 0.4]}}, "tag": "e"})
    answer = await socket.receive()
    assert answer["tag"] == "e" and answer["agents"]["red_1"]["policy"] == "rnn"
    episode_id = answer["episode_id"]
    assert (await client.get(f"/v1/models/team/episodes/{episode_id}")).status_code == 200
    socket.send({"end": True, "tag": "f"})
    assert await socket.receive() == {"ended": episode_id, "tag": "f"}
    assert (await socket.first()) == {"type": "websocket.close", "code": 1000}
    await asyncio.wait_for(socket.task, 10)
    assert (await client.get(f"/v1/models/team/episodes/{episode_id}")).status_code == 410  # ended


async def test_a_resumed_episode_goes_on_and_bad_upgrades_are_http_answers(served):
    app, client = served
    first = Socket(app, "/v1/models/team/agents/stream", b"episode_id=keep-1")
    await first.first()
    first.send({"agents": {"red_1": {"observation": [0.1, 0.2, 0.3, 0.4]}}, "episode_start": True})
    assert (await first.receive())["episode_id"] == "keep-1"
    await first.leave()  # the socket closed; the episode stays
    again = Socket(app, "/v1/models/team/agents/stream", b"episode_id=keep-1")
    await again.first()
    again.send({"agents": {"red_1": {"observation": [0.1, 0.2, 0.3, 0.4], "reward": 1.0}}})
    answer = await again.receive()
    assert answer["episode_id"] == "keep-1"
    described = (await client.get("/v1/models/team/episodes/keep-1")).json()
    assert described["steps"] == 2  # the resumed stream's step continued the episode
    await again.leave()
    for path, query, status in (("/v1/models/nope/agents/stream", b"", 404),
                                ("/v1/models/team/agents/stream", b"version=1", 400),
                                ("/v1/models/team/agents/stream", b"episode_id=a&seed=1", 400),
                                ("/v1/models/team/agents/stream", b"episode_id=" + b"x" * 200, 400)):
        refused = Socket(app, path, query)
        start = await refused.first()
        assert start["type"] == "websocket.http.response.start" and start["status"] == status, (path, query)
        await asyncio.wait_for(refused.task, 10)


async def test_metrics_count_the_open_streams_by_kind(served):
    app, client = served

    async def open_count(kind: str) -> float:
        text = (await client.get("/metrics")).text
        line = next(ln for ln in text.splitlines() if ln.startswith(f'rlserve_streams_open{{kind="{kind}"}}'))
        return float(line.split()[-1])

    assert await open_count("agents") == 0 and await open_count("stream") == 0
    sockets = [Socket(app, "/v1/models/team/agents/stream") for _ in range(2)]
    single = Socket(app, "/v1/models/mlp/stream")
    for socket in (*sockets, single):
        await socket.first()
    assert await open_count("agents") == 2 and await open_count("stream") == 1
    for socket in sockets:
        await socket.leave()
    assert await open_count("agents") == 0 and await open_count("stream") == 1
    await single.leave()
    assert await open_count("stream") == 0


async def test_metrics_count_each_streamed_step_in_the_latency_histogram(served):
    """rlserve_request_latency_seconds{model=<set>}: one per step answered, over the stream
    (route agents_stream) as over HTTP (agents_act); a refused step counts as an error only."""
    app, client = served

    async def counts() -> dict[str, float]:
        text = (await client.get("/metrics")).text
        found = {}
        for route in ("agents_stream", "agents_act"):
            prefix = f'rlserve_request_latency_seconds_count{{model="team",route="{route}"}} '
            found[route] = next((float(ln.removeprefix(prefix)) for ln in text.splitlines()
                                 if ln.startswith(prefix)), 0.0)
        return found

    before = await counts()
    socket = Socket(app, "/v1/models/team/agents/stream", b"seed=4")
    await socket.first()
    steps = _script(6)
    for i, agents in enumerate(steps):
        socket.send({"agents": agents, "tag": i})
    socket.send({"agents": {"red_1": {"observation": [0.1, 0.2]}}, "tag": "bad"})  # 422: answered, not a step
    got = [await socket.receive() for _ in range(len(steps) + 1)]
    assert [g["tag"] for g in got] == [*range(len(steps)), "bad"] and got[-1]["status"] == 422
    await socket.leave()
    await _over_http(client, steps[:2], seed=4)
    after = await counts()
    assert after["agents_stream"] - before["agents_stream"] == len(steps)
    assert after["agents_act"] - before["agents_act"] == 2


async def test_the_experience_log_records_streamed_steps_as_it_records_http_ones(make_client, team_set, tmp_path):
    """Through the set's use case: each agent's streamed steps are its policy's logged episode,
    with the event ids the answers carried, closed by the agent's last observation."""
    from rlserve.service.experience import reader

    log = tmp_path / "log"
    app, _ = make_client(("mlp",), policy_sets=[str(team_set)], experience_log=log)
    socket = Socket(app, "/v1/models/team/agents/stream", b"seed=2&explore=true")
    await socket.first()
    rng = np.random.default_rng(5)
    sent, served = [], []
    for step in range(4):
        obs = rng.uniform(-1, 1, 4).astype(np.float32).tolist()
        sent.append(obs)
        one: dict[str, Any] = {"observation": obs, **({"reward": 0.5 * step} if step else {})}
        if step == 3:
            one["done"] = True
        socket.send({"agents": {"red_1": one}, **({"episode_end": True} if step == 3 else {})})
        answer = (await socket.receive())["agents"]["red_1"]
        if step < 3:
            assert isinstance(answer["event_id"], str)
            served.append(answer)
    await socket.leave()
    app.state.experience.close()
    [episode] = reader.episodes(log, "team.rnn")
    assert (episode.agent_id, episode.module_id) == ("red_1", "rnn") and episode.whole and episode.is_terminated
    assert episode.event_ids == [got["event_id"] for got in served]
    assert episode.rewards == pytest.approx([0.5, 1.0, 1.5])
    np.testing.assert_array_equal(np.stack(episode.observations), np.array(sent, np.float32))
