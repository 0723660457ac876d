"""Sessions over HTTP: lifecycle, 404 vs 410, eviction, ordering, isolation from bad input."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from conftest import error_of

pytestmark = pytest.mark.asyncio

OBS = [0.1, -0.2, 0.3, 0.05]


class Clock:
    def __init__(self):
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


def use_clock(app, name: str) -> Clock:
    clock = Clock()
    for policy in app.state.registry.entry(name).versions.values():
        policy.sessions.clock = clock
    return clock


async def act(client, sid, obs=OBS, **extra):
    return await client.post("/v1/models/lstm/act", json={"observation": obs, "session_id": sid, **extra})


async def test_create_inspect_end(make_client):
    _, client = make_client(("lstm",))
    r = await client.post("/v1/models/lstm/sessions", json={"seed": 3})
    assert r.status_code == 201
    sid = r.json()["session_id"]
    assert r.json()["version"] == "1" and r.json()["seed"] == 3
    assert (await act(client, sid)).status_code == 200
    info = (await client.get(f"/v1/models/lstm/sessions/{sid}")).json()
    assert info["steps"] == 1
    assert (await client.delete(f"/v1/models/lstm/sessions/{sid}")).status_code == 200
    gone = await act(client, sid)
    assert gone.status_code == 410 and error_of(gone)["code"] == "session_expired"
    assert (await client.get(f"/v1/models/lstm/sessions/{sid}")).status_code == 410


async def test_unknown_session_is_404_and_episode_start_creates(make_client):
    _, client = make_client(("lstm",))
    r = await act(client, "fresh")
    assert r.status_code == 404 and error_of(r)["code"] == "session_not_found"
    assert error_of(r)["field"] == "session_id"
    assert (await act(client, "fresh", episode_start=True)).status_code == 200
    assert (await act(client, "fresh")).status_code == 200


async def test_duplicate_create_is_409(make_client):
    _, client = make_client(("lstm",))
    assert (await client.post("/v1/models/lstm/sessions", json={"session_id": "x"})).status_code == 201
    r = await client.post("/v1/models/lstm/sessions", json={"session_id": "x"})
    assert r.status_code == 409 and error_of(r)["code"] == "session_conflict"
    r = await client.post("/v1/models/lstm/sessions", json={"session_id": "y", "bogus": 1})
    assert r.status_code == 400 and error_of(r)["field"] == "bogus"


async def test_idle_session_expires_with_410(make_client):
    app, client = make_client(("lstm",), session_idle_ttl_s=60)
    clock = use_clock(app, "lstm")
    assert (await act(client, "s", episode_start=True)).status_code == 200
    clock.now += 30
    assert (await act(client, "s")).status_code == 200
    clock.now += 61
    r = await act(client, "s")
    assert r.status_code == 410 and "idle" in error_of(r)["message"]


async def test_cap_evicts_least_recently_used(make_client):
    _, client = make_client(("lstm",), max_sessions=2)
    for sid in ("a", "b"):
        await act(client, sid, episode_start=True)
    await act(client, "a")  # b is now the least recently used
    await act(client, "c", episode_start=True)
    r = await act(client, "b")
    assert r.status_code == 410 and "evicted" in error_of(r)["message"]
    assert (await act(client, "a")).status_code == 200


async def test_bad_input_does_not_touch_the_session(make_client):
    _, client = make_client(("lstm",))
    rng = np.random.default_rng(0)
    steps = rng.uniform(-1, 1, (4, 4)).round(3).tolist()
    for sid in ("probe", "control"):
        await act(client, sid, steps[0], episode_start=True, explore=False)
    # A bad request for "probe": invalid observation plus a reward and an action report.
    bad = await act(client, "probe", [1, 2], reward=5.0, prev_action=[0.5, 0.5])
    assert bad.status_code == 422
    # Not finite as float32. (Outside the Box is fine: a previous action is the raw sample.)
    bad = await act(client, "probe", steps[1], reward=5.0, prev_action=[1e39, 0.0])
    assert bad.status_code == 422 and error_of(bad)["field"] == "prev_action"
    bad = await act(client, "probe", steps[1], reward=5.0, prev_action=[0.5])  # wrong shape
    assert bad.status_code == 422 and error_of(bad)["field"] == "prev_action"
    for obs in steps[1:]:
        a = (await act(client, "probe", obs, explore=False, outputs=["dist_inputs"])).json()
        b = (await act(client, "control", obs, explore=False, outputs=["dist_inputs"])).json()
        assert a["dist_inputs"] == b["dist_inputs"]


async def test_requests_for_one_session_apply_in_order(make_client):
    _, client = make_client(("lstm",), max_batch_delay_ms=20)
    rng = np.random.default_rng(2)
    steps = rng.uniform(-1, 1, (6, 4)).round(3).tolist()
    await act(client, "fast", steps[0], episode_start=True, explore=False)
    await act(client, "slow", steps[0], episode_start=True, explore=False)
    concurrent = await asyncio.gather(*(act(client, "fast", o, explore=False, debug=True, outputs=["dist_inputs"])
                                        for o in steps[1:]))
    batch_ids = [r.json()["debug"]["batch_id"] for r in concurrent]
    assert batch_ids == sorted(batch_ids) and len(set(batch_ids)) == len(batch_ids)
    for obs, fast in zip(steps[1:], concurrent, strict=True):
        slow = (await act(client, "slow", obs, explore=False, outputs=["dist_inputs"])).json()
        assert fast.json()["dist_inputs"] == slow["dist_inputs"]


async def test_duplicate_session_in_one_request_is_400(make_client):
    _, client = make_client(("lstm",))
    r = await client.post("/v1/models/lstm/act", json={"observations": [OBS, OBS], "session_ids": ["d", "d"],
                                                        "episode_starts": [True, True]})
    assert r.status_code == 400 and error_of(r)["field"] == "session_ids[1]"


async def test_stateless_rows_mix_with_session_rows(make_client):
    _, client = make_client(("lstm",))
    r = await client.post("/v1/models/lstm/act", json={
        "observations": [OBS, OBS], "session_ids": ["m", None], "episode_starts": [True, False],
        "explore": False, "outputs": ["dist_inputs"]})
    body = r.json()
    assert body["session_ids"] == ["m", None]
    # First step of a fresh episode == a stateless step (both start from the initial state).
    assert body["dist_inputs"][0] == body["dist_inputs"][1]
    r = await client.post("/v1/models/lstm/act", json={
        "observations": [OBS, OBS], "session_ids": ["m", None], "explore": False, "outputs": ["dist_inputs"]})
    body = r.json()
    assert body["dist_inputs"][0] != body["dist_inputs"][1]  # the session remembered its state


async def test_episode_start_resets_state(make_client):
    _, client = make_client(("lstm",))
    first = (await act(client, "e", episode_start=True, explore=False, outputs=["dist_inputs"])).json()
    second = (await act(client, "e", explore=False, outputs=["dist_inputs"])).json()
    again = (await act(client, "e", episode_start=True, explore=False, outputs=["dist_inputs"])).json()
    assert first["dist_inputs"] != second["dist_inputs"] and again["dist_inputs"] == first["dist_inputs"]


async def test_explicitly_created_session_starts_fresh_on_a_recycled_slot(make_client):
    _, client = make_client(("lstm",), max_sessions=1)
    fresh = (await client.post("/v1/models/lstm/act", json={"observation": OBS, "explore": False,
                                                            "outputs": ["dist_inputs"]})).json()["dist_inputs"]
    sid = (await client.post("/v1/models/lstm/sessions", json={})).json()["session_id"]
    for _ in range(3):
        await act(client, sid, [0.9, 0.9, -0.9, 0.5], explore=False)
    await client.delete(f"/v1/models/lstm/sessions/{sid}")
    again = (await client.post("/v1/models/lstm/sessions", json={})).json()["session_id"]
    first = (await act(client, again, explore=False, outputs=["dist_inputs"])).json()["dist_inputs"]
    assert first == fresh
