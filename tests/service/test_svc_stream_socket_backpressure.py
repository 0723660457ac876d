"""A stream's backpressure on ``rlserve serve``'s own socket protocol (``stream/protocol.py``),
in process: the real app on the embedded models, the upgrade taken by ``FastUpgrade`` on a
transport that records what the protocol does to it.

A client that sends twelve messages at once gets at most ``RLSERVE_STREAM_MAX_INFLIGHT`` of
them taken, the socket's reading paused, the rest left unparsed, and every answer in order;
while the transport's write buffer is over its high-water mark (asyncio's
``pause_writing``) no message is taken at all.
"""

from __future__ import annotations

import asyncio
import json

from rlserve.service.app import create_app
from rlserve.service.settings import Settings

MESSAGES = 12
INFLIGHT = 3
KEY = b"dGhlIHNhbXBsZSBub25jZQ=="


class Transport:
    """What asyncio's socket transport offers the protocol, recorded."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.protocol = None
        self.paused = False
        self.pauses = 0

    def write(self, data: bytes) -> None:
        self.written += data

    def set_protocol(self, protocol) -> None:
        self.protocol = protocol

    def pause_reading(self) -> None:
        self.paused, self.pauses = True, self.pauses + 1

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return False

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def close(self) -> None:
        pass


def _frame(i: int) -> bytes:
    payload = json.dumps({"observation": [0.0, 0.01 * i], "tag": i}).encode()
    return bytes([0x81, 0x80 | len(payload)]) + b"\0\0\0\0" + payload


def _answers(written: bytes) -> list[dict]:
    body = written.split(b"\r\n\r\n", 1)[1]
    out, pos = [], 0
    while pos < len(body):
        n, head = body[pos + 1] & 0x7F, pos + 2
        assert body[pos] == 0x81 and n < 127  # text frames of answers under 64 KiB
        if n == 126:
            n, head = int.from_bytes(body[head:head + 2], "big"), head + 2
        out.append(json.loads(body[head:head + n]))
        pos = head + n
    return out


async def _drive() -> tuple[int, bool, int, list[dict], int]:
    app = create_app(Settings(stream_max_inflight=INFLIGHT, verify_on_load=False))
    assert app.stream_upgrade is not None
    transport = Transport()
    headers = [(b"upgrade", b"websocket"), (b"connection", b"Upgrade"), (b"sec-websocket-key", KEY),
               (b"sec-websocket-version", b"13")]
    taken = app.stream_upgrade("GET", b"/v1/models/cartpole-memory/stream?seed=1", headers, transport, [], set())
    assert taken and transport.written.startswith(b"HTTP/1.1 101")
    protocol = transport.protocol
    protocol.data_received(b"".join(_frame(i) for i in range(MESSAGES)))
    unanswered_at_once, paused_at_once = protocol.connection.unanswered, transport.paused
    for _ in range(200):  # the batches run; each answer written makes room for one message more
        await asyncio.sleep(0.01)
        if len(_answers(transport.written)) == MESSAGES:
            break
    protocol.pause_writing()  # the peer stopped reading: the buffer is over its high-water mark
    protocol.data_received(_frame(MESSAGES))
    taken_while_full = protocol.connection.unanswered
    protocol.resume_writing()
    for _ in range(200):
        await asyncio.sleep(0.01)
        if len(_answers(transport.written)) == MESSAGES + 1:
            break
    return unanswered_at_once, paused_at_once, taken_while_full, _answers(transport.written), transport.pauses


def test_the_socket_takes_at_most_max_inflight_and_pauses_reading() -> None:
    at_once, paused, while_full, answers, pauses = asyncio.run(_drive())
    assert at_once == INFLIGHT and paused  # not MESSAGES: the rest waits unparsed
    assert while_full == 0
    assert [answer["tag"] for answer in answers] == list(range(MESSAGES + 1))  # in order, none lost
    assert all(answer["action"] in (0, 1) for answer in answers)
    assert pauses >= 2
