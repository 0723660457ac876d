"""Two replicas racing on one session: each session's two steps sent one to each replica
within a millisecond, and the check that the stored session is a linear history of the
steps answered (used by the JSON and the Open Inference Protocol race tests)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import numpy as np
from fleet import ACT, MODEL, Lane, Replica, step_body


@dataclass
class Answer:
    status_code: int
    body: dict

    def json(self) -> dict:
        return self.body

    @property
    def text(self) -> str:
        return json.dumps(self.body)


async def race(servers, sessions, path: str, body: Callable[[int, int], dict]) -> list[tuple[Answer, Answer]]:
    """Each session's two steps (``body(k, replica)``), one to each replica, all written
    within a millisecond: connections are opened first, then every request goes out before
    any answer is read."""
    lanes = {(k, i): Replica(servers[i].url) for k in sessions for i in (0, 1)}
    for replica in lanes.values():  # connect now, so the sends below are only writes
        lane = Lane(replica.host, replica.port)
        await lane.connect()
        replica.idle.append(lane)

    async def send(k: int, i: int) -> Answer:
        status, answer = await lanes[k, i].post(path, body(k, i))
        return Answer(status, answer)

    try:
        return list(await asyncio.gather(*(asyncio.gather(send(k, 0), send(k, 1)) for k in sessions)))
    finally:
        for replica in lanes.values():
            replica.close()


def race_body(session: int, which: str) -> dict:
    obs = [0.5, -0.5] if which == "a" else [-0.9, 0.9]
    return {"observation": obs, "session_id": f"s{session}", "reward": 1.0, "outputs": ["dist_inputs"]}


async def assert_linear_history(client, servers, k: int, a: Answer, b: Answer) -> None:
    """The stored session is the initial step followed by exactly the steps answered 200,
    in one order, and each 200 answer is what that order computes (no forked state)."""
    winners = [(which, r.json()) for which, r in (("a", a), ("b", b)) if r.status_code == 200]
    url = f"/v1/models/{MODEL}/sessions/s{k}"
    info = (await client.get(servers[1].url + url)).json()
    assert info["steps"] == 1 + len(winners)
    probe = {"observation": [0.1, 0.1], "session_id": f"s{k}", "explore": False, "outputs": ["dist_inputs"]}
    stored_next = (await client.post(servers[0].url + ACT, json=probe)).json()["dist_inputs"]
    app_orders = [winners] if len(winners) == 1 else [winners, winners[::-1]]
    for order in app_orders:
        replay = await _replay(k, [which for which, _ in order])
        answers_match = all(np.allclose(got["dist_inputs"], expected, rtol=1e-4, atol=1e-4)
                            for (_, got), expected in zip(order, replay[:-1], strict=True))
        if answers_match and np.allclose(stored_next, replay[-1], rtol=1e-4, atol=1e-4):
            return
    raise AssertionError(f"session s{k}: the stored state is no linear history of the answered steps {winners}")


_REFERENCE_APPS: dict[str, object] = {}


async def _replay(k: int, order: list[str]) -> list[list[float]]:
    """Logits of the racing steps applied in ``order`` on an in-process app, then of the probe."""
    from rlserve.service.app import create_app
    from rlserve.service.settings import Settings

    app = _REFERENCE_APPS.get("app") or _REFERENCE_APPS.setdefault("app", create_app(Settings()))
    sid = f"ref-{k}-{''.join(order)}-{time.monotonic_ns()}"
    out = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ref") as client:
        first = step_body(k, 0)
        first["session_id"] = sid
        await client.post(ACT, json=first)
        for which in order:
            body = race_body(k, which)
            body["session_id"] = sid
            out.append((await client.post(ACT, json=body)).json()["dist_inputs"])
        probe = {"observation": [0.1, 0.1], "session_id": sid, "explore": False, "outputs": ["dist_inputs"]}
        out.append((await client.post(ACT, json=probe)).json()["dist_inputs"])
    return out
