"""RFC 6455 on the wire, without I/O: the opening handshake's accept key, a client's frames
parsed one at a time from the bytes that came, and the server's frames.

    bytes ─► FrameParser.feed ─► FrameParser.next ─► (opcode, message) | None (needs more)

``next`` returns whole messages (a fragmented message's frames joined; control frames
between its fragments come out on their own, as the RFC allows), a text message as
``str`` (invalid UTF-8 fails the connection, 1007), a close frame's status code, and pings
and pongs with their payload. Everything a client may not send raises ``ProtocolError``
with the close code to fail the connection with: an unmasked frame (1002), reserved bits
(no extension is ever negotiated), an unknown opcode, a fragmented or long control frame,
a continuation without a start or a new message inside one, a malformed close frame, and
a message longer than ``max_size`` (``TooBig``, 1009), refused by its header before its
payload is buffered.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct

OP_CONTINUATION, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
CLOSE_NORMAL = 1000
CLOSE_PROTOCOL = 1002
CLOSE_NO_STATUS = 1005  # a close frame without a code (never sent; answered with 1000)
CLOSE_NOT_UTF8 = 1007
CLOSE_TOO_BIG = 1009
CLOSE_RESTART = 1012  # the server is shutting down
MAX_CONTROL = 125  # bytes of a control frame's payload
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_SENDABLE = frozenset({1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014})
_UNMASKED = b"\x00\x00\x00\x00"


class ProtocolError(Exception):
    """What a client sent breaks the protocol: fail the connection with ``code``."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code, self.reason = code, reason


class TooBig(ProtocolError):
    """A message longer than the limit (close 1009): its opcode, and the size its frames declared so far."""

    def __init__(self, opcode: int, size: int, limit: int):
        super().__init__(CLOSE_TOO_BIG, f"a message of {size} bytes, more than {limit}")
        self.opcode, self.size = opcode, size


def valid_key(key: bytes) -> bool:
    """``Sec-WebSocket-Key``: base64 of 16 bytes (RFC 6455 4.2.1)."""
    try:
        return len(base64.b64decode(key, validate=True)) == 16
    except (binascii.Error, ValueError):
        return False


def accept_key(key: bytes) -> bytes:
    """``Sec-WebSocket-Accept`` for a client's ``Sec-WebSocket-Key``."""
    return base64.b64encode(hashlib.sha1(key + _GUID).digest())


def encode(opcode: int, payload: bytes) -> bytes:
    """One unmasked, unfragmented server frame."""
    n = len(payload)
    if n < 126:
        return bytes((0x80 | opcode, n)) + payload
    if n < 65536:
        return struct.pack("!BBH", 0x80 | opcode, 126, n) + payload
    return struct.pack("!BBQ", 0x80 | opcode, 127, n) + payload


def close_frame(code: int, reason: str = "") -> bytes:
    return encode(OP_CLOSE, struct.pack("!H", code) + reason.encode()[:MAX_CONTROL - 2])


def unmask(payload: bytes | bytearray, mask: bytes | bytearray) -> bytes:
    if mask == _UNMASKED:
        return bytes(payload)
    n = len(payload)
    key = (bytes(mask) * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")


class FrameParser:
    """A client's frames, parsed as their bytes come (``feed``), one message per ``next``."""

    __slots__ = ("max_size", "_buf", "_pos", "_opcode", "_parts", "_size")

    def __init__(self, max_size: int):
        self.max_size = max_size
        self._buf: bytes | bytearray = b""
        self._pos = 0
        self._opcode = 0  # the opcode of the fragmented message under way (0: none)
        self._parts: list[bytes] = []
        self._size = 0  # its bytes so far

    def feed(self, data: bytes) -> None:
        if self._pos >= len(self._buf):  # everything before was parsed: no copy
            self._buf, self._pos = data, 0
            return
        if self._pos or not isinstance(self._buf, bytearray):
            self._buf = bytearray(self._buf[self._pos:])
            self._pos = 0
        self._buf += data

    def next(self) -> tuple[int, bytes | str | int] | None:
        """The next message or control frame, or None until more bytes come."""
        while True:
            frame = self._frame()
            if frame is None:
                return None
            fin, opcode, payload = frame
            if opcode >= OP_CLOSE:
                return opcode, _close_code(payload) if opcode == OP_CLOSE else payload
            if opcode == OP_CONTINUATION:
                self._parts.append(payload)
                if not fin:
                    continue
                opcode, payload = self._opcode, b"".join(self._parts)
                self._opcode, self._parts, self._size = 0, [], 0
            elif not fin:
                self._opcode, self._parts = opcode, [payload]
                continue
            if opcode == OP_TEXT:
                try:
                    return opcode, payload.decode()
                except UnicodeDecodeError:
                    raise ProtocolError(CLOSE_NOT_UTF8, "a text message that is not UTF-8") from None
            return opcode, payload

    def _frame(self) -> tuple[bool, int, bytes] | None:
        buf, pos = self._buf, self._pos
        end = len(buf)
        if end - pos < 2:
            return None
        first, second = buf[pos], buf[pos + 1]
        fin, opcode, n = first & 0x80, first & 0x0F, second & 0x7F
        if first & 0x70:
            raise ProtocolError(CLOSE_PROTOCOL, "reserved bits set: no extension was negotiated")
        if not second & 0x80:
            raise ProtocolError(CLOSE_PROTOCOL, "a client frame that is not masked")
        if opcode >= OP_CLOSE:
            if opcode > OP_PONG:
                raise ProtocolError(CLOSE_PROTOCOL, f"unknown opcode {opcode}")
            if not fin or n > MAX_CONTROL:
                raise ProtocolError(CLOSE_PROTOCOL, "a control frame fragmented or over 125 bytes")
        elif opcode > OP_BINARY:
            raise ProtocolError(CLOSE_PROTOCOL, f"unknown opcode {opcode}")
        elif (opcode == OP_CONTINUATION) != bool(self._opcode):
            raise ProtocolError(CLOSE_PROTOCOL, "a continuation frame without a message under way"
                                if opcode == OP_CONTINUATION else "a new message inside a fragmented one")
        head = pos + 2
        if n >= 126:
            width = 2 if n == 126 else 8
            if end - head < width:
                return None
            n = int.from_bytes(buf[head:head + width], "big")
            head += width
            if n >> 63:
                raise ProtocolError(CLOSE_PROTOCOL, "a frame length with its most significant bit set")
        if opcode < OP_CLOSE and self._size + n > self.max_size:
            raise TooBig(self._opcode or opcode, self._size + n, self.max_size)
        start = head + 4
        if end - start < n:
            return None
        self._pos = start + n
        payload = unmask(buf[start:start + n], buf[head:start])
        if opcode < OP_CLOSE:  # the bytes of the message under way
            self._size = 0 if fin else self._size + n
        return bool(fin), opcode, payload


def _close_code(payload: bytes) -> int:
    """A close frame's status code (1005 for none); a malformed one fails the connection."""
    if not payload:
        return CLOSE_NO_STATUS
    if len(payload) == 1:
        raise ProtocolError(CLOSE_PROTOCOL, "a close frame of one byte")
    code = int.from_bytes(payload[:2], "big")
    if code not in _SENDABLE and not 3000 <= code <= 4999:
        raise ProtocolError(CLOSE_PROTOCOL, f"close code {code} may not be sent")
    try:
        payload[2:].decode()
    except UnicodeDecodeError:
        raise ProtocolError(CLOSE_NOT_UTF8, "a close reason that is not UTF-8") from None
    return code
