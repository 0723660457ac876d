"""Streams (``/v1/models/{name}/stream``) against one real `rlserve serve` process.

The server batches with a short delay (so a stream's step and an HTTP step can share a
batch), logs every access and records experience; its limits are small so each is reached
with a few frames: 4 streams, 3 unreadable messages, 64 KiB per message.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import tempfile
import time
import uuid

import httpx
import msgpack
import numpy as np
import pytest
from plain_http import HTTP
from server_process import ServerProcess
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from rlserve.client import AsyncPolicyClient, PolicyClient, Stream
from rlserve.client.envs import make_env
from rlserve.client.errors import InvalidInputError, OverloadedError, SessionExpiredError
from rlserve.client.gym_runner import run_episodes
from rlserve.client.stream import stream_url

pytestmark = pytest.mark.e2e

MODEL = "cartpole-memory"  # the embedded LSTM policy; observations of 2 floats
NO_VELOCITY = "rlserve/CartPoleNoVelocity-v1"
MAX_STREAMS, MAX_UNREADABLE, MAX_BYTES = 4, 3, 65536


@pytest.fixture(scope="module")
def server():
    with tempfile.TemporaryDirectory() as log_dir:
        proc = ServerProcess({
            "RLSERVE_MAX_BATCH_DELAY_MS": "15", "RLSERVE_ACCESS_LOG": "all", "RLSERVE_EXPERIENCE_LOG": log_dir,
            "RLSERVE_STREAM_MAX_CONNECTIONS": str(MAX_STREAMS),
            "RLSERVE_STREAM_MAX_UNREADABLE": str(MAX_UNREADABLE), "RLSERVE_MAX_BODY_BYTES": str(MAX_BYTES)}).start()
        try:
            yield proc
        finally:
            proc.terminate()


@pytest.fixture(scope="module")
def url(server):
    return server.url


def _ws(url: str, **options):
    return connect(stream_url(url, MODEL, **options), max_size=None, compression=None, legacy=True)


def _closed_code(ws) -> int:
    with pytest.raises(ConnectionClosed) as closed:
        for _ in range(MAX_UNREADABLE + 2):  # error frames before the close
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code


def _http_episode(url: str, seed: int, steps: int) -> list[tuple[int, float]]:
    env = make_env(NO_VELOCITY)
    obs, _ = env.reset(seed=0)
    session, out, reward = uuid.uuid4().hex, [], None
    with httpx.Client(base_url=url) as http:
        for i in range(steps):
            body = {"observation": obs.tolist(), "session_id": session, "explore": True}
            body.update({"episode_start": True, "seed": seed} if i == 0 else {"reward": reward})
            answer = http.post(f"/v1/models/{MODEL}/act", json=body).json()
            out.append((answer["action"], answer["logp"]))
            obs, reward, terminated, truncated, _ = env.step(answer["action"])
            if terminated or truncated:
                break
    return out


def _stream_episode(url: str, seed: int, steps: int, binary: bool) -> list[tuple[int, float]]:
    env = make_env(NO_VELOCITY)
    obs, _ = env.reset(seed=0)
    out, reward = [], None
    with Stream(url, MODEL, seed=seed, explore=True, binary=binary) as stream:
        for _ in range(steps):
            answer = stream.step(obs if binary else obs.tolist(), reward=reward)
            out.append((answer.action, answer.logp))
            obs, reward, terminated, truncated, _ = env.step(answer.action)
            if terminated or truncated:
                break
    return out


def test_a_recurrent_episode_over_the_stream_is_the_http_episode(url):
    http = _http_episode(url, seed=7, steps=30)
    assert len(http) > 5
    assert _stream_episode(url, seed=7, steps=30, binary=False) == http  # logp for logp: JSON floats round-trip
    assert _stream_episode(url, seed=7, steps=30, binary=True) == http
    assert _stream_episode(url, seed=8, steps=30, binary=True) != http  # the seed reaches the sampler


def test_steps_in_flight_are_answered_in_order_with_their_tags(url):
    with _ws(url, seed=1) as ws:
        for i in range(10):
            obs = [0.1, 0.2] if i != 4 else [0.1, 0.2, 0.3]  # one refused in the middle
            ws.send(json.dumps({"observation": obs, "tag": i, "reward": None if i == 0 else 1.0}))
        answers = [json.loads(ws.recv(timeout=10)) for _ in range(10)]
    assert [a["tag"] for a in answers] == list(range(10))
    assert answers[4]["error"]["field"] == "observation" and answers[4]["status"] == 422
    assert all("action" in a for i, a in enumerate(answers) if i != 4)


def test_error_frames_keep_the_stream_open_in_both_kinds(url):
    with _ws(url) as ws:
        ws.send(msgpack.packb({"observation": [0.0, float("nan")], "tag": "m"}))
        refused = msgpack.unpackb(ws.recv(timeout=10))
        assert (refused["status"], refused["tag"], refused["error"]["field"]) == (422, "m", "observation")
        ws.send(json.dumps({"observation": [0.0, 0.1], "reward": "lots"}))  # unreadable: no tag can be read
        unreadable = json.loads(ws.recv(timeout=10))
        assert unreadable["status"] == 400 and unreadable["error"]["field"] == "reward" and "tag" not in unreadable
        ws.send(msgpack.packb({"observation": np.float32([0.0, 0.1]).tolist(), "tag": 2}))
        assert msgpack.unpackb(ws.recv(timeout=10))["action"] in (0, 1)


def test_too_many_unreadable_messages_close_with_1008(url):
    with _ws(url) as ws:
        for _ in range(MAX_UNREADABLE):
            ws.send(b"\xc1")
        assert _closed_code(ws) == 1008


def test_an_oversized_message_closes_with_1009(url):
    with _ws(url) as ws:
        ws.send(json.dumps({"observation": [0.0] * (MAX_BYTES // 4)}))
        assert _closed_code(ws) == 1009


def _open_all(url: str, n: int) -> list:
    opened = []
    try:
        for _ in range(n):
            opened.append(_ws(url))
    except InvalidStatus:
        for ws in opened:
            ws.close()
        raise
    return opened


def test_the_connection_cap_refuses_the_upgrade_with_503(url):
    deadline = time.monotonic() + 20
    while True:  # streams of earlier tests may still be closing on the server
        try:
            opened = _open_all(url, MAX_STREAMS)
            break
        except InvalidStatus:
            assert time.monotonic() < deadline, "the cap's count never came back down"
            time.sleep(0.1)
    try:
        with pytest.raises(OverloadedError) as refused:
            Stream(url, MODEL)
        assert refused.value.code == "streams_full" and refused.value.status == 503
    finally:
        for ws in opened:
            ws.close()


def test_a_dropped_stream_resumes_by_id_and_retries_its_last_step(url):
    observations = [[0.01 * i, -0.02 * i] for i in range(6)]
    with Stream(url, MODEL, seed=11, explore=True) as whole:
        expected = [whole.step(obs, reward=1.0, step=i).raw for i, obs in enumerate(observations)]
    first = Stream(url, MODEL, seed=11, explore=True)
    got = [first.step(obs, reward=1.0, step=i).raw for i, obs in enumerate(observations[:3])]
    session = first.session_id
    first.close()  # the connection drops; the session stays
    with Stream(url, MODEL, session_id=session, explore=True) as resumed:
        again = resumed.step(observations[2], reward=1.0, step=2).raw  # the answer lost in the drop
        assert (again["action"], again["logp"]) == (got[2]["action"], got[2]["logp"])
        got += [resumed.step(obs, reward=1.0, step=i).raw for i, obs in enumerate(observations) if i >= 3]
    assert [(a["action"], a["logp"]) for a in got] == [(a["action"], a["logp"]) for a in expected]


def test_stream_rows_and_http_rows_share_a_batch(url):
    shared = False
    with Stream(url, MODEL, seed=1, debug=True) as stream, httpx.Client(base_url=url) as http:
        http.get("/healthz")  # connected before the race
        for _ in range(10):
            stream.send([0.0, 0.1])
            answer = http.post(f"/v1/models/{MODEL}/act", json={"observation": [0.0, 0.1], "debug": True}).json()
            streamed = stream.receive().raw
            if streamed["debug"]["batch_id"] == answer["debug"]["batch_id"]:
                assert streamed["debug"]["batch_requests"] >= 2
                shared = True
                break
    assert shared


def test_steps_are_logged_measured_and_recorded_like_http_steps(server, url):
    with Stream(url, MODEL, seed=2) as stream:
        answer = stream.step([0.0, 0.1])
        assert answer.raw.get("event_id")  # the experience log recorded the step
        with pytest.raises(InvalidInputError):
            stream.step([0.0])
    metrics = HTTP.get(f"{url}/metrics").text
    assert f'rlserve_request_latency_seconds_count{{model="{MODEL}",route="stream"}}' in metrics
    deadline = time.monotonic() + 10
    while "WS /v1/models/{name}/stream 422" not in server.output():
        assert time.monotonic() < deadline, server.output()
        time.sleep(0.05)
    assert "WS /v1/models/{name}/stream 200" in server.output()


def test_the_async_client_steps_and_ends_the_session(url):
    async def play() -> str:
        async with AsyncPolicyClient(url, MODEL) as client, client.stream(seed=4, binary=True) as stream:
            first = await stream.step(np.float32([0.0, 0.1]))
            second = await stream.step(np.float32([0.0, 0.2]), reward=1.0)
            assert first.action in (0, 1) and second.action in (0, 1)
            session = stream.session_id
            await stream.end()
            return session

    session = asyncio.run(play())
    with PolicyClient(url, MODEL) as client, pytest.raises(SessionExpiredError):
        client.act([0.0, 0.1], session_id=session)


def test_the_gym_runner_plays_the_same_episodes_over_streams(url):
    with PolicyClient(url, MODEL) as client:
        def env():
            return make_env(NO_VELOCITY)

        http = run_episodes(client, env, episodes=2, parallel=2, max_steps=12, seed=5)
        streamed = run_episodes(client, env, episodes=2, parallel=2, max_steps=12, seed=5, stream=True)
    assert (streamed.returns, streamed.lengths) == (http.returns, http.lengths)
    assert streamed.lengths[0] > 0


def _fuzz_frame(rng: np.random.Generator) -> str | bytes:
    """One malformed, oversized or odd frame."""
    pick = int(rng.integers(9))
    if pick == 0:
        return rng.bytes(int(rng.integers(0, 300)))  # random bytes as msgpack
    if pick == 1:
        return "".join(chr(int(c)) for c in rng.integers(32, 0x2FFF, size=int(rng.integers(0, 200))))
    if pick == 2:
        return "[" * int(rng.integers(100, 5000))  # deep, unclosed nesting
    if pick == 3:
        return json.dumps({"observation": [float(rng.normal()) for _ in range(int(rng.integers(0, 5)))],
                           "tag": int(rng.integers(1 << 40)), "reward": float(rng.normal())})
    if pick == 4:  # arrays whose declared shape, dtype and bytes disagree
        shape = [int(n) for n in rng.integers(-2, 1 << 31, size=int(rng.integers(0, 4)))]
        dtype = str(rng.choice(["<f4", "<f8", ">f4", "|O", "<U4", "|b1", "nope", "<i8"]))
        return msgpack.packb({"observation": {"__ndarray__": True, "data": rng.bytes(int(rng.integers(0, 64))),
                                              "dtype": dtype, "shape": shape}})
    if pick == 5:
        return json.dumps({"observation": "x" * int(rng.integers(0, 1000)), "action_mask": {"a": [1]}})
    if pick == 6:
        return json.dumps({"observation": [0.0, 0.1], "prev_action": 99, "step": int(rng.integers(0, 5))})
    if pick == 7:
        return b"\x81\xabobservation" + bytes([0xDD]) + b"\xff\xff\xff\xff"  # an array claiming 4G entries
    return "x" * (MAX_BYTES + int(rng.integers(1, 100)))  # oversized


def test_a_fuzzer_of_frames_never_breaks_the_server(server, url):
    seed = time.time_ns() % (1 << 32)
    print(f"stream fuzzer seed {seed}")  # a failure reruns with rng = np.random.default_rng(seed)
    rng = np.random.default_rng(seed)
    with Stream(url, MODEL, seed=3) as bystander:  # another connection, open the whole time
        bystander.step([0.0, 0.1])
        ws = _ws(url)
        try:
            for _ in range(150):
                try:
                    ws.send(_fuzz_frame(rng))
                    answer = ws.recv(timeout=10)
                except ConnectionClosed as closed:
                    assert closed.rcvd is not None and closed.rcvd.code in (1008, 1009), (seed, closed)
                    ws.close()
                    ws = _ws(url)
                    continue
                payload = msgpack.unpackb(answer) if isinstance(answer, bytes) else json.loads(answer)
                assert payload.get("status", 200) < 500, (seed, payload)
        finally:
            ws.close()
        assert bystander.step([0.0, 0.2], reward=1.0).action in (0, 1)
    with PolicyClient(url, MODEL) as client:
        assert client.act([0.0, 0.1]).action in (0, 1)
    assert "Traceback" not in server.output(), (seed, server.output())  # nothing raised inside the server


def test_episode_start_with_a_seed_restarts_the_episode_and_a_seed_alone_is_refused(url):
    steps = [[0.01 * i, -0.02 * i] for i in range(20)]

    def play(ws, first: dict) -> list:
        answers = []
        for i, obs in enumerate(steps):
            ws.send(json.dumps({"observation": obs, **(first if i == 0 else {"reward": 1.0})}))
            answer = json.loads(ws.recv(timeout=10))
            answers.append((answer["action"], answer["logp"]))
        return answers

    with _ws(url, explore="true") as fresh:
        expected = play(fresh, {"seed": 5})  # a new stream's first step starts its episode
    with _ws(url, seed=6, explore="true") as ws:
        assert play(ws, {}) != expected
        ws.send(json.dumps({"observation": steps[0], "seed": 5}))  # no episode starts here
        refused = json.loads(ws.recv(timeout=10))
        assert (refused["status"], refused["error"]["field"]) == (400, "seed")
        assert play(ws, {"episode_start": True, "seed": 5}) == expected


# --------------------------------------------------------------------------- the socket itself

def _raw_upgrade(url: str, headers: dict[str, str], path: str = f"/v1/models/{MODEL}/stream?seed=1"):
    """A TCP socket that sent an upgrade request with ``headers``, and the server's answer head."""
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    sock.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\n{lines}\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    return sock, head.decode("latin-1").lower()


_UPGRADE = {"upgrade": "websocket", "connection": "Upgrade", "sec-websocket-version": "13",
            "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==", "sec-websocket-extensions": "permessage-deflate"}


def _client_frame(opcode: int, payload: bytes, fin: bool = True, mask: bytes = b"\x01\x02\x03\x04") -> bytes:
    head = bytes([(0x80 if fin else 0) | opcode, 0x80 | len(payload)])  # payloads under 126 bytes here
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def _server_frame(sock) -> tuple[int, bytes]:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            more = sock.recv(n - len(data))
            assert more, "the server closed the socket before a whole frame"
            data += more
        return data

    first, second = exactly(2)
    assert not second & 0x80  # server frames are never masked
    n = second & 0x7F
    if n == 126:
        n = int.from_bytes(exactly(2), "big")
    elif n == 127:
        n = int.from_bytes(exactly(8), "big")
    return first & 0x0F, exactly(n)


@pytest.mark.parametrize("headers, status, field", [
    ({**_UPGRADE, "sec-websocket-version": "8"}, 426, "sec-websocket-version"),
    ({k: v for k, v in _UPGRADE.items() if k != "sec-websocket-key"}, 400, "sec-websocket-key"),
    ({**_UPGRADE, "sec-websocket-key": "c2hvcnQ="}, 400, "sec-websocket-key")])
def test_an_upgrade_the_rfc_refuses_is_answered_with_the_json_error_body(url, headers, status, field):
    sock, head = _raw_upgrade(url, headers)
    with sock:
        assert head.startswith(f"http/1.1 {status}")
        if status == 426:
            assert "sec-websocket-version: 13\r\n" in head
        length = int(head.split("content-length: ", 1)[1].split("\r\n", 1)[0])
        body = b""
        while len(body) < length:
            body += sock.recv(length - len(body))
        assert json.loads(body)["error"]["field"] == field


def test_fragments_with_a_ping_between_are_one_step_and_a_close_is_echoed(url):
    sock, head = _raw_upgrade(url, _UPGRADE)
    with sock:
        assert head.startswith("http/1.1 101")
        assert "sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo=" in head  # RFC 6455's example key
        assert "sec-websocket-extensions" not in head  # permessage-deflate offered, not taken
        message = json.dumps({"observation": [0.0, 0.1], "tag": "f"}).encode()
        sock.sendall(_client_frame(0x1, message[:10], fin=False) + _client_frame(0x9, b"hi")
                     + _client_frame(0x0, message[10:20], fin=False) + _client_frame(0x0, message[20:]))
        assert _server_frame(sock) == (0xA, b"hi")  # the pong, before the fragmented message's answer
        opcode, answer = _server_frame(sock)
        assert opcode == 0x1 and json.loads(answer)["tag"] == "f" and json.loads(answer)["action"] in (0, 1)
        sock.sendall(_client_frame(0x8, struct.pack("!H", 1001)))
        assert _server_frame(sock) == (0x8, struct.pack("!H", 1001))
        assert sock.recv(1) == b""  # and the server closed the socket


@pytest.mark.parametrize("frame, code", [
    (bytes([0x81, 0x02]) + b"{}", 1002),  # not masked
    (_client_frame(0x3, b"x"), 1002),  # a reserved opcode
    (_client_frame(0x0, b"x"), 1002),  # a continuation of nothing
    (_client_frame(0x1, b"\xff"), 1007)])  # text that is not UTF-8
def test_a_frame_that_breaks_the_protocol_closes_with_its_code(url, frame, code):
    sock, head = _raw_upgrade(url, _UPGRADE)
    with sock:
        assert head.startswith("http/1.1 101")
        sock.sendall(frame)
        assert _server_frame(sock) == (0x8, struct.pack("!H", code))
