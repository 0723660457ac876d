"""`rlserve serve` answers act requests inside uvicorn's HTTP protocol (service/act_protocol.py).

Driven over raw sockets against real servers on the embedded default models: the answers
equal the raw ASGI handler's (RLSERVE_ACT_PROTOCOL=false) byte for byte, and the HTTP/1.1
behaviour the protocol takes over from uvicorn's ASGI cycle still holds: keep-alive,
pipelining, HTTP/1.0, Expect: 100-continue, chunked and slow bodies, the body limit,
clients that leave with a request in flight.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from plain_http import HTTP

from tests.e2e.server_process import running_server

pytestmark = pytest.mark.e2e

ACT = "/v1/models/cartpole/act"
MEMORY_ACT = "/v1/models/cartpole-memory/act"
MAX_BODY = 4096


@pytest.fixture(scope="module")
def protocol_url() -> Iterator[str]:
    with running_server(env={"RLSERVE_MAX_BODY_BYTES": str(MAX_BODY)}) as url:
        yield url


@pytest.fixture(scope="module")
def asgi_url() -> Iterator[str]:
    with running_server(env={"RLSERVE_MAX_BODY_BYTES": str(MAX_BODY), "RLSERVE_ACT_PROTOCOL": "false"}) as url:
        yield url


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def _request(path: str, body: bytes | None = None, *, version: str = "1.1", headers: dict[str, str] | None = None,
             method: str = "POST") -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "Host: 127.0.0.1"]
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    if body is not None and "Transfer-Encoding" not in all_headers:
        all_headers.setdefault("Content-Length", str(len(body)))
    lines += [f"{k}: {v}" for k, v in all_headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


class Conn:
    """One HTTP/1.1 connection read response by response (Content-Length framing)."""

    def __init__(self, url: str):
        self.sock = socket.create_connection(_address(url), timeout=10)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buffer += chunk
        return bool(chunk)

    def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            if not self._fill():
                raise ConnectionError(f"closed before a response head; got {self.buffer!r}")
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *header_lines = head.decode().split("\r\n")
        headers = {}
        for line in header_lines:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            if not self._fill():
                raise ConnectionError("closed inside a response body")
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(status_line.split()[1]), headers, body

    def closed_by_server(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, TimeoutError):
            return False

    def close(self) -> None:
        self.sock.close()


def _act_body(obs=(0.01, -0.02, 0.03, 0.04), **extra) -> bytes:
    return json.dumps({"observation": list(obs), **extra}).encode()


def _exchange(url: str, data: bytes) -> tuple[int, dict[str, str], bytes]:
    conn = Conn(url)
    try:
        conn.send(data)
        return conn.response()
    finally:
        conn.close()


def test_the_protocol_serves_act_and_leaves_other_routes_to_the_app(protocol_url):
    status, headers, body = _exchange(protocol_url, _request(ACT, _act_body(explore=False)))
    assert status == 200 and headers["content-type"] == "application/json"
    assert {"date", "server"} <= set(headers)  # uvicorn's default headers, as on the ASGI path
    assert json.loads(body)["action"] in (0, 1)
    status, _, body = _exchange(protocol_url, _request("/healthz", method="GET"))
    assert status == 200 and json.loads(body)["status"] == "ok"
    # GET on the act path is not an act request: FastAPI answers 405 as before.
    assert _exchange(protocol_url, _request(ACT, method="GET"))[0] == 405


# Deterministic requests and refusals: the protocol and the ASGI handler answer alike.
SAME = [
    ("single", ACT, _act_body(explore=False, outputs=["value", "entropy", "dist_inputs"])),
    (
        "batch",
        ACT,
        json.dumps({"observations": [[0.1, 0.0, -0.1, 0.2], [0.0, 0.3, 0.1, -0.2]], "explore": False}).encode(),
    ),
    ("pinned-version-unknown", "/v1/models/cartpole/versions/nope/act", _act_body()),
    ("unknown-model", "/v1/models/nope/act", _act_body()),
    ("bad-json", ACT, b"{not json"),
    ("empty-body", ACT, b""),
    ("wrong-width", ACT, _act_body(obs=(1.0, 2.0))),
    ("unknown-field", ACT, _act_body(obz=1)),
    ("unknown-session", ACT, _act_body(session_id="never-seen")),
    ("too-large", ACT, _act_body(obs=[0.5] * 1000)),
]


@pytest.mark.parametrize("name,path,body", SAME, ids=[s[0] for s in SAME])
def test_answers_equal_the_raw_asgi_handler(protocol_url, asgi_url, name, path, body):
    ours = _exchange(protocol_url, _request(path, body))
    theirs = _exchange(asgi_url, _request(path, body))
    assert ours[0] == theirs[0]
    assert json.loads(ours[2]) == json.loads(theirs[2])
    wanted = {"content-type", "retry-after"}
    assert {k: v for k, v in ours[1].items() if k in wanted} == {k: v for k, v in theirs[1].items() if k in wanted}
    if name == "too-large":
        assert ours[0] == 413


def test_session_steps_equal_the_raw_asgi_handler_step_by_step(protocol_url, asgi_url):
    """The LSTM default model, deterministic: same actions, logp and values on both paths."""
    answers = {}
    for url in (protocol_url, asgi_url):
        conn = Conn(url)
        steps = []
        for t in range(6):
            obs = [0.05 * t, -0.01 * t]
            body = _act_body(obs=obs, session_id="replay", episode_start=t == 0, explore=False, outputs=["value"],
                             **({"reward": 1.0} if t else {}))
            conn.send(_request(MEMORY_ACT, body))
            status, _, raw = conn.response()
            assert status == 200, raw
            steps.append(json.loads(raw))
        conn.close()
        answers[url] = steps
    assert answers[protocol_url] == answers[asgi_url]


def test_keep_alive_and_pipelined_requests_answer_in_order(protocol_url):
    conn = Conn(protocol_url)
    try:
        conn.send(_request(ACT, _act_body(explore=False)))
        assert conn.response()[0] == 200
        # Three requests in one write: act, a route of the app, act with a refusal.
        conn.send(_request(ACT, _act_body(explore=False, outputs=["value"]))
                  + _request("/healthz", method="GET")
                  + _request(ACT, _act_body(obs=(1.0,))))
        first, second, third = conn.response(), conn.response(), conn.response()
        assert first[0] == 200 and "value" in json.loads(first[2])
        assert second[0] == 200 and json.loads(second[2])["status"] == "ok"
        assert third[0] == 422 and json.loads(third[2])["error"]["field"] == "observation"
        conn.send(_request(ACT, _act_body()))
        assert conn.response()[0] == 200  # the connection is still usable
    finally:
        conn.close()


def test_http_1_0_gets_its_answer_and_a_closed_connection(protocol_url):
    conn = Conn(protocol_url)
    try:
        conn.send(_request(ACT, _act_body(), version="1.0"))
        status, headers, _ = conn.response()
        assert status == 200 and headers.get("connection") == "close"
        assert conn.closed_by_server()
    finally:
        conn.close()


def test_expect_100_continue_is_honoured(protocol_url):
    conn = Conn(protocol_url)
    try:
        body = _act_body()
        conn.send(_request(ACT, None, headers={"Expect": "100-continue", "Content-Length": str(len(body))}))
        status, _, _ = conn.response()
        assert status == 100
        conn.send(body)
        assert conn.response()[0] == 200
    finally:
        conn.close()


def test_chunked_and_slowly_arriving_bodies(protocol_url):
    body = _act_body(explore=False)
    conn = Conn(protocol_url)
    try:
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:10], body[10:]) if part) + b"0\r\n\r\n"
        conn.send(_request(ACT, None, headers={"Transfer-Encoding": "chunked"}) + chunks)
        chunked = conn.response()
        head = _request(ACT, body)
        split = len(head) - len(body) + 5
        conn.send(head[:split])
        time.sleep(0.05)  # the body's rest arrives in a later read on the server
        conn.send(head[split:])
        slow = conn.response()
    finally:
        conn.close()
    assert chunked[0] == slow[0] == 200
    assert json.loads(chunked[2]) == json.loads(slow[2])


def test_a_body_over_the_limit_is_refused_and_the_connection_closed(protocol_url):
    conn = Conn(protocol_url)
    try:
        big = json.dumps({"observation": [0.5] * 4}).encode() + b" " * (2 * MAX_BODY)
        head = _request(ACT, big)
        conn.send(head[:len(head) - len(big) + MAX_BODY + 10])  # more than the limit, not all of it
        status, headers, body = conn.response()
        assert status == 413 and json.loads(body)["error"]["expected"] == MAX_BODY
        assert headers.get("connection") == "close"
    finally:
        conn.close()
    assert HTTP.get(f"{protocol_url}/healthz").status_code == 200


def test_clients_leaving_with_requests_in_flight_do_not_hurt_the_server(protocol_url):
    session = {"session_id": "stays", "explore": False}
    with httpx.Client(base_url=protocol_url) as client:
        first = client.post(MEMORY_ACT, json={"observation": [0.0, 0.0], "episode_start": True, **session})
        assert first.status_code == 200
        for _ in range(30):  # send and hang up before the answer
            conn = Conn(protocol_url)
            conn.send(_request(ACT, _act_body()) + _request(ACT, _act_body()))
            conn.close()
        assert client.get("/healthz").status_code == 200
        step = client.post(MEMORY_ACT, json={"observation": [0.0, 0.0], **session})
        assert step.status_code == 200 and step.json()["session_id"] == "stays"
