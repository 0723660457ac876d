"""Whatever a stream's decoder or step handler raises, the message is answered and the
stream goes on (``StreamConnection._take``), on ``rlserve serve``'s socket protocol in process.

The faults are put in on purpose: a decoder that raises a ``ValueError`` on one message (as a
reader may on bytes nobody foresaw) must give a 400 error frame counted as unreadable, and
``RLSERVE_STREAM_MAX_UNREADABLE`` of them close the stream with 1008; a step whose accept
raises a ``RuntimeError`` (a server bug) must give a 500 error frame and be logged. Without
the catch-all in ``_take`` the first drops the connection's reading and the second leaves the
message unanswered, so the answers below would be missing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from rlserve.service.app import create_app
from rlserve.service.settings import Settings
from rlserve.service.stream import frames
from tests.service.test_svc_stream_socket_backpressure import KEY, Transport, _frame

MAX_UNREADABLE = 3
BAD_TAG = 7  # the message the faulty decoder cannot read


class FaultyDecoder(type(frames.STREAM)):  # type: ignore[misc]
    """``frames.STREAM``, except that it raises on the message tagged ``BAD_TAG``."""

    def decode(self, kind: str, data: str | bytes) -> Any:
        if json.loads(data)["tag"] == BAD_TAG:
            raise ValueError("a reader's surprise")
        return super().decode(kind, data)


def _frames(written: bytes) -> list[tuple[int, bytes]]:
    """(opcode, payload) of each frame the server wrote after its 101."""
    body = written.split(b"\r\n\r\n", 1)[1]
    out, pos = [], 0
    while pos < len(body):
        n, head = body[pos + 1] & 0x7F, pos + 2
        if n == 126:
            n, head = int.from_bytes(body[head:head + 2], "big"), head + 2
        out.append((body[pos] & 0x0F, bytes(body[head:head + n])))
        pos = head + n
    return out


async def _drive(fault: str) -> tuple[list[tuple[int, bytes]], Any]:
    app = create_app(Settings(stream_max_unreadable=MAX_UNREADABLE, verify_on_load=False))
    assert app.stream_upgrade is not None
    transport = Transport()
    headers = [(b"upgrade", b"websocket"), (b"connection", b"Upgrade"), (b"sec-websocket-key", KEY),
               (b"sec-websocket-version", b"13")]
    assert app.stream_upgrade("GET", b"/v1/models/cartpole-memory/stream?seed=1", headers, transport, [], set())
    protocol = transport.protocol
    connection = protocol.connection
    if fault == "decode":
        connection.dialect = FaultyDecoder()
    else:
        accept = connection.service.accept

        def faulty_accept(name: str, version: Any, request: Any, started: float) -> Any:
            if request.observation == [0.0, 0.01 * BAD_TAG]:
                raise RuntimeError("a server bug")
            return accept(name, version, request, started)

        connection.service.accept = faulty_accept
    for i in range(10):
        protocol.data_received(_frame(i))
        for _ in range(100):
            await asyncio.sleep(0.01)
            if connection.unanswered == 0:
                break
    return _frames(transport.written), connection


def test_a_decoder_fault_is_a_counted_400_and_the_stream_goes_on(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="rlserve.stream"):
        written, connection = asyncio.run(_drive("decode"))
    answers = [json.loads(payload) for opcode, payload in written if opcode == 0x1]
    assert len(answers) == 10  # one frame per message, in order
    error = answers[BAD_TAG]
    assert error["status"] == 400 and "ValueError" in error["error"]["message"] and "tag" not in error
    assert [a["tag"] for i, a in enumerate(answers) if i != BAD_TAG] == [i for i in range(10) if i != BAD_TAG]
    assert connection.unreadable == 1 and not connection.closed
    assert any("decoder raised ValueError" in r.getMessage() for r in caplog.records)


def test_a_handler_fault_is_a_logged_500_and_the_stream_goes_on(caplog) -> None:
    with caplog.at_level(logging.ERROR, logger="rlserve.stream"):
        written, connection = asyncio.run(_drive("accept"))
    answers = [json.loads(payload) for opcode, payload in written if opcode == 0x1]
    assert [a["tag"] for a in answers] == list(range(10))
    assert answers[BAD_TAG]["status"] == 500 and answers[BAD_TAG]["error"]["message"] == "internal error: RuntimeError"
    assert all("action" in a for i, a in enumerate(answers) if i != BAD_TAG)
    assert connection.unreadable == 0
    assert any(r.exc_info and r.exc_info[0] is RuntimeError for r in caplog.records)


def test_decoder_faults_count_to_the_unreadable_limit() -> None:
    async def drive() -> list[tuple[int, bytes]]:
        app = create_app(Settings(stream_max_unreadable=MAX_UNREADABLE, verify_on_load=False))
        transport = Transport()
        headers = [(b"upgrade", b"websocket"), (b"connection", b"Upgrade"), (b"sec-websocket-key", KEY),
                   (b"sec-websocket-version", b"13")]
        assert app.stream_upgrade is not None
        app.stream_upgrade("GET", b"/v1/models/cartpole-memory/stream", headers, transport, [], set())
        transport.protocol.connection.dialect = FaultyDecoder()
        for _ in range(MAX_UNREADABLE):
            transport.protocol.data_received(_frame(BAD_TAG))
            await asyncio.sleep(0.01)
        return _frames(transport.written)

    written = asyncio.run(drive())
    assert [opcode for opcode, _ in written] == [0x1] * MAX_UNREADABLE + [0x8]
    assert int.from_bytes(written[-1][1][:2], "big") == 1008
