"""The access log of a real `rlserve serve` process: one line per request, from the act
protocol (act and infer answered without ASGI), the raw ASGI handler and FastAPI's routes;
the route's template, never the raw path or the body; refused requests logged by default."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from server_process import ServerProcess

pytestmark = pytest.mark.e2e

MARKER = "body-marker-7f3a"  # sent in bodies and ids; must never reach the log
ACT = "/v1/models/{name}/act"


@contextmanager
def server(**env: str) -> Iterator[ServerProcess]:
    proc = ServerProcess({"RLSERVE_LOG_LEVEL": "warning", **env})
    try:
        proc.start()
        yield proc
    finally:
        proc.stop()


def log_text(proc: ServerProcess) -> str:
    """Everything the server wrote to stderr so far (read without moving the file's offset)."""
    assert proc.log is not None
    fd = proc.log.fileno()
    return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")


def access_lines(proc: ServerProcess, count: int, json_lines: bool = True) -> list:
    """The first ``count`` access lines, polled for (each is written once its answer is)."""
    deadline = time.monotonic() + 30
    while True:
        text = log_text(proc)
        if json_lines:
            found = [json.loads(line) for line in text.splitlines() if line.startswith('{"time"')]
            found = [line for line in found if line["route"] != "/readyz"]  # the start's readiness polls
        else:
            found = [line for line in text.splitlines() if " ACCESS " in line]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)  # polling interval


def _requests(client: httpx.Client) -> list[tuple[str, int]]:
    """Requests of every kind, with the status each gets."""
    sent = []

    def send(method: str, path: str, expect: int, **kwargs) -> None:
        answer = client.request(method, path, **kwargs)
        assert answer.status_code == expect, (path, answer.text)
        sent.append((path, expect))

    send("POST", "/v1/models/cartpole/act", 200, json={"observation": [0.0, 0.1, 0.0, 0.1]})
    send("POST", "/v1/models/cartpole/act", 200, json={"observations": [[0.0] * 4] * 3})
    send("POST", "/v1/models/cartpole/versions/1/act", 200, json={"observation": [0.0] * 4})
    send("POST", "/v1/models/cartpole/act", 422, json={"observation": [0.0, 0.1, "nan", MARKER]})
    send("POST", "/v1/models/cartpole/act", 400, content=b"{not json " + MARKER.encode())
    send("POST", "/v2/models/cartpole/infer", 200,
         json={"inputs": [{"name": "obs", "datatype": "FP32", "shape": [2, 4], "data": [0.0] * 8}]})
    send("GET", f"/v1/models/cartpole-memory/sessions/{MARKER}", 404)
    send("GET", "/v1/models", 200)
    send("GET", f"/nowhere/{MARKER}", 404)
    send("POST", f"/v1/models/{'m' * 300}/act", 404, json={"observation": [0.0] * 4})
    return sent


def test_every_request_in_json() -> None:
    with server(RLSERVE_ACCESS_LOG="all", RLSERVE_ACCESS_LOG_FORMAT="json") as proc, \
            httpx.Client(base_url=proc.url) as client:
        sent = _requests(client)
        lines = access_lines(proc, len(sent))
        text = log_text(proc)
    assert MARKER not in text, "a body or a raw path reached the log"
    assert len(lines) == len(sent), lines
    got = [(line["method"], line["route"], line["status"], line["model"], line["rows"]) for line in lines]
    assert got == [
        ("POST", ACT, 200, "cartpole", 1),
        ("POST", ACT, 200, "cartpole", 3),
        ("POST", "/v1/models/{name}/versions/{version}/act", 200, "cartpole", 1),
        ("POST", ACT, 422, "cartpole", 1),
        ("POST", ACT, 400, "cartpole", None),  # the body did not parse: no rows known
        ("POST", "/v2/models/{name}/infer", 200, "cartpole", 2),
        ("GET", "/v1/models/{name}/sessions/{session_id}", 404, "cartpole-memory", None),
        ("GET", "/v1/models", 200, None, None),
        ("GET", "(no route)", 404, None, None),
        ("POST", ACT, 404, "<300 characters>", 1),
    ]
    assert all(isinstance(line["latency_ms"], float) and 0 <= line["latency_ms"] < 30_000 for line in lines)


@pytest.mark.parametrize("protocol", ["true", "false"], ids=["act-protocol", "asgi-handler"])
def test_refused_requests_leave_a_line_by_default(protocol: str) -> None:
    """The default logs the answers with status >= 400 only, on either act transport."""
    with server(RLSERVE_ACT_PROTOCOL=protocol) as proc, httpx.Client(base_url=proc.url) as client:
        for _ in range(3):
            assert client.post("/v1/models/cartpole/act", json={"observation": [0.0] * 4}).status_code == 200
        assert client.post("/v1/models/cartpole/act", json={"observation": [None] * 4}).status_code == 422
        assert client.get("/v1/models/nope").status_code == 404
        lines = access_lines(proc, 2, json_lines=False)
    assert len(lines) == 2, lines
    assert f" ACCESS POST {ACT} 422 " in lines[0] and lines[0].endswith("ms model=cartpole rows=1"), lines[0]
    assert " ACCESS GET /v1/models/{name} 404 " in lines[1] and "model=nope rows=-" in lines[1]


def test_off_writes_nothing() -> None:
    with server(RLSERVE_ACCESS_LOG="off") as proc, httpx.Client(base_url=proc.url) as client:
        assert client.post("/v1/models/cartpole/act", json={"observation": [None] * 4}).status_code == 422
        assert client.get("/v1/models/nope").status_code == 404
        # Answered after both on the same connection: their lines, if any, were written by then.
        assert client.get("/readyz").status_code == 200
        assert " ACCESS " not in log_text(proc)
