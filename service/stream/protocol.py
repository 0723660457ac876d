"""A stream's socket after its upgrade (``upgrade.py``): frames parsed and answers written
by the server's own asyncio protocol, without a WebSocket library, ASGI messages or a task.

    data_received ─► FrameParser ─► StreamConnection.take ─► the batch's reply ─► outbox
      ─► send: one transport.write per answer frame, in message order

Backpressure: the protocol takes a message only while fewer than ``max_inflight`` are
unanswered and the transport's write buffer is under its high-water mark (asyncio's
``pause_writing``: 64 KiB by default); otherwise it pauses reading, so the parsed-but-not-
taken bytes are at most one read, the kernel's buffers fill and TCP pushes back on the
client. Reading resumes once an answer is written or the buffer drains.

Control frames: a ping is answered with a pong at once; a client's close is echoed and
the socket closed (answers still coming are dropped, as for a client that leaves). A
close the server starts (``end``, 1008, 1009, a protocol error, the server's shutdown:
1012) is written after the answers before it, then the write side is shut (FIN) and the
client's close reply read and discarded until it closes too, or ``CLOSE_TIMEOUT_S`` pass.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from rlserve.service.stream import frames
from rlserve.service.stream.connection import StreamConnection
from rlserve.service.stream.websocket import (
    CLOSE_NO_STATUS,
    CLOSE_NORMAL,
    CLOSE_RESTART,
    OP_BINARY,
    OP_CLOSE,
    OP_PING,
    OP_PONG,
    OP_TEXT,
    FrameParser,
    ProtocolError,
    TooBig,
    close_frame,
    encode,
)

log = logging.getLogger("rlserve.stream")

CLOSE_TIMEOUT_S = 5.0  # after the server's close frame, how long the client has to close


class StreamProtocol(asyncio.Protocol):
    """One stream's connection (``connection.Outlet`` of its ``StreamConnection``)."""

    connection: StreamConnection  # set by ``upgrade.py`` before the first byte is read

    def __init__(self, transport: asyncio.Transport, max_size: int, connections: set[Any],
                 on_lost: Callable[[], None]):
        self.transport = transport
        self.parser: FrameParser | None = FrameParser(max_size)  # None: the rest of the input is dropped
        self.connections = connections  # the server's open connections (its shutdown closes them)
        self.on_lost = on_lost
        self.read_paused = False
        self.write_full = False  # the transport's buffer is over its high-water mark
        self.pumping = False
        self.close_sent = False
        self.timer: asyncio.TimerHandle | None = None
        connections.add(self)

    # ------------------------------------------------------------------ Outlet

    def send(self, frame: dict[str, Any]) -> None:
        data = frame.get("bytes")
        if data is None:
            self.transport.write(encode(OP_TEXT, frame["text"].encode()))
        else:
            self.transport.write(encode(OP_BINARY, data))
        if self.read_paused:  # an answer written is room for a message
            self._pump()

    def close(self, code: int) -> None:
        if self.close_sent:
            return
        self.close_sent = True
        transport = self.transport
        transport.write(close_frame(code))
        if transport.can_write_eof():
            transport.write_eof()  # the client reads the close, replies and closes; its reply is read here
            self.timer = asyncio.get_running_loop().call_later(CLOSE_TIMEOUT_S, transport.close)
        else:
            transport.close()
        self._flow()

    # ------------------------------------------------------------------ asyncio.Protocol

    def data_received(self, data: bytes) -> None:
        if self.parser is not None:
            self.parser.feed(data)
            self._pump()

    def eof_received(self) -> bool:
        return False  # the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.connection.lost()
        self.connections.discard(self)
        if self.timer is not None:
            self.timer.cancel()
        self.on_lost()

    def pause_writing(self) -> None:
        self.write_full = True
        self._flow()

    def resume_writing(self) -> None:
        self.write_full = False
        self._pump()

    def shutdown(self) -> None:
        """The server stops (uvicorn's graceful shutdown): close 1012 after the answers under way."""
        self.connection.close(CLOSE_RESTART)

    # ------------------------------------------------------------------ reading

    def _pump(self) -> None:
        """Take the parsed messages while there is room, then pause or resume reading."""
        if self.pumping:
            return
        self.pumping = True
        connection = self.connection
        limit = connection.limits.max_inflight
        try:
            while (parser := self.parser) is not None and not self.write_full and connection.unanswered < limit:
                event = parser.next()
                if event is None:
                    break
                opcode, value = event
                if opcode == OP_TEXT:
                    connection.take(frames.TEXT, value)  # type: ignore[arg-type]
                elif opcode == OP_BINARY:
                    connection.take(frames.BINARY, value)  # type: ignore[arg-type]
                elif opcode == OP_PING:
                    if not self.close_sent:
                        self.transport.write(encode(OP_PONG, value))  # type: ignore[arg-type]
                elif opcode == OP_CLOSE:
                    self._closed_by_client(value)  # type: ignore[arg-type]
                    return
        except TooBig as exc:
            self.parser = None
            connection.too_big(frames.TEXT if exc.opcode == OP_TEXT else frames.BINARY, exc.size)
        except ProtocolError as exc:
            self.parser = None
            log.info("stream closed (%d): %s", exc.code, exc.reason)
            connection.lost()
            self.close(exc.code)
        finally:
            self.pumping = False
        self._flow()

    def _closed_by_client(self, code: int) -> None:
        self.parser = None
        self.connection.lost()
        if not self.close_sent:
            self.close_sent = True
            self.transport.write(close_frame(CLOSE_NORMAL if code == CLOSE_NO_STATUS else code))
        self.transport.close()

    def _flow(self) -> None:
        """Read while there is room (or, after the close, to see the client's reply)."""
        full = not self.close_sent and (self.write_full
                                        or self.connection.unanswered >= self.connection.limits.max_inflight)
        if full != self.read_paused and not self.transport.is_closing():
            self.read_paused = full
            if full:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()
