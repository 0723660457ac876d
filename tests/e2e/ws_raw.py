"""A WebSocket client on a plain socket that writes its frames by hand (RFC 6455 section 5),
so a test can send what no WebSocket library would: wrong lengths, unmasked frames,
reserved bits, unknown opcodes, continuation frames out of place, invalid UTF-8.

``RawSocket.frame`` builds one frame's bytes (any header it is told); ``read`` returns the
server's next frame as ``(opcode, payload)``, or None when the server closed the TCP connection.
"""

from __future__ import annotations

import base64
import os
import socket
import struct

TEXT, BINARY, CONTINUATION, CLOSE, PING, PONG = 0x1, 0x2, 0x0, 0x8, 0x9, 0xA


def frame(opcode: int, payload: bytes, *, fin: bool = True, mask: bool = True, rsv: int = 0,
          length: int | None = None) -> bytes:
    """One frame: ``length`` overrides the declared payload length (a lie the header tells)."""
    declared = len(payload) if length is None else length
    head = bytes([(0x80 if fin else 0) | (rsv & 0x7) << 4 | opcode & 0xF])
    bit = 0x80 if mask else 0
    if declared < 126:
        head += bytes([bit | declared])
    elif declared < 1 << 16:
        head += bytes([bit | 126]) + struct.pack("!H", declared)
    else:
        head += bytes([bit | 127]) + struct.pack("!Q", declared)
    if not mask:
        return head + payload
    key = os.urandom(4)
    pad = key * (len(payload) // 4 + 1)
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(pad[:len(payload)], "big")).to_bytes(len(payload), "big")
    return head + key + masked


class RawSocket:
    """One upgraded connection; the handshake is checked (101), then frames go as they are told."""

    def __init__(self, port: int, path: str, timeout: float = 10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # each frame its own segment, no wait
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                          .encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError(f"no upgrade answer: {head!r}")
            head += chunk
        head, self.buffer = head.split(b"\r\n\r\n", 1)
        self.status = int(head.split(b" ", 2)[1])
        if self.status != 101:
            raise ConnectionError(f"upgrade refused: {head.decode('latin-1')}")

    def write(self, data: bytes) -> bool:
        """Send bytes; False when the server has closed the connection already."""
        try:
            self.sock.sendall(data)
            return True
        except (BrokenPipeError, ConnectionResetError):
            return False

    def _exactly(self, count: int) -> bytes | None:
        while len(self.buffer) < count:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            self.buffer += chunk
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def read(self) -> tuple[int, bytes] | None:
        """The server's next frame (servers do not mask); None at the end of the connection."""
        head = self._exactly(2)
        if head is None:
            return None
        length = head[1] & 0x7F
        if length == 126:
            more = self._exactly(2)
            length = None if more is None else struct.unpack("!H", more)[0]
        elif length == 127:
            more = self._exactly(8)
            length = None if more is None else struct.unpack("!Q", more)[0]
        payload = None if length is None else self._exactly(length)
        return None if payload is None else (head[0] & 0xF, payload)

    def close(self) -> None:
        self.sock.close()
