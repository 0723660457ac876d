"""A stream's backpressure, in process: a client that does not read its answers makes the
server stop reading its messages at ``RLSERVE_STREAM_MAX_INFLIGHT``, not queue them.

The app is the real one on the embedded models (real batches, real sessions); the socket is
an ASGI receive/send pair whose ``send`` does not return until the test lets it, as a
socket whose peer stopped reading blocks its writer.
"""

from __future__ import annotations

import asyncio
import json

from rlserve.service.app import create_app
from rlserve.service.settings import Settings

MESSAGES = 12
INFLIGHT = 3


async def _drive() -> tuple[int, int, list[dict]]:
    app = create_app(Settings(stream_max_inflight=INFLIGHT, verify_on_load=False))
    incoming: list[dict] = [{"type": "websocket.connect"}] + [
        {"type": "websocket.receive", "text": json.dumps({"observation": [0.0, 0.01 * i], "tag": i})}
        for i in range(MESSAGES)]
    taken = 0
    drained = asyncio.Event()
    sent: list[dict] = []

    async def receive() -> dict:
        nonlocal taken
        if taken < len(incoming):
            taken += 1
            return incoming[taken - 1]
        await drained.wait()  # then the client leaves
        await asyncio.sleep(0.05)
        return {"type": "websocket.disconnect", "code": 1000}

    async def send(message: dict) -> None:
        if message["type"] == "websocket.send":
            await drained.wait()  # the peer reads nothing until the test says so
            sent.append(json.loads(message["text"]))

    scope = {"type": "websocket", "path": "/v1/models/cartpole-memory/stream", "query_string": b"seed=1",
             "headers": [], "extensions": {"websocket.http.response": {}}}
    assert app.stream is not None
    task = asyncio.create_task(app.stream(scope, receive, send, app.stream.match(scope)))
    for _ in range(100):  # the steps run and their answers wait on the blocked socket
        await asyncio.sleep(0.01)
    taken_while_blocked = taken - 1  # the connect message is no step
    drained.set()
    await asyncio.wait_for(task, 10)
    return taken_while_blocked, taken - 1, sent


def test_a_stream_stops_reading_while_its_answers_cannot_be_sent() -> None:
    while_blocked, in_all, sent = asyncio.run(_drive())
    assert while_blocked == INFLIGHT  # and not MESSAGES: the rest stayed in the socket
    assert in_all == MESSAGES
    assert [answer["tag"] for answer in sent] == list(range(MESSAGES))
    assert all(answer["action"] in (0, 1) for answer in sent)
