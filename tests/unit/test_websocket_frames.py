"""RFC 6455 frames as the stream's socket reads them (``service/stream/websocket.py``): whole
messages out of fragments and masks, control frames between fragments, and every frame a
client may not send refused with the close code the RFC names."""

from __future__ import annotations

import os
import random
import struct

import pytest

from rlserve.service.stream import websocket as ws
from rlserve.service.stream.websocket import FrameParser, ProtocolError, TooBig

LIMIT = 1000


def frame(opcode: int, payload: bytes, *, fin: bool = True, mask: bytes = b"\x5a\x13\xc7\x08", rsv: int = 0,
          masked: bool = True) -> bytes:
    """A client frame built by hand, masked with ``mask`` (fixed: parametrized ids stay the same
    in every test process)."""
    n = len(payload)
    first = (0x80 if fin else 0) | rsv | opcode
    bit = 0x80 if masked else 0
    if n < 126:
        head = struct.pack("!BB", first, bit | n)
    elif n < 65536:
        head = struct.pack("!BBH", first, bit | 126, n)
    else:
        head = struct.pack("!BBQ", first, bit | 127, n)
    if not masked:
        return head + payload
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def messages(data: bytes, *, chunk: int | None = None, limit: int = LIMIT) -> list:
    parser = FrameParser(limit)
    out = []
    pieces = [data] if chunk is None else [data[i:i + chunk] for i in range(0, len(data), chunk)]
    for piece in pieces:
        parser.feed(piece)
        while (event := parser.next()) is not None:
            out.append(event)
    return out


def refused(data: bytes, limit: int = LIMIT) -> ProtocolError:
    with pytest.raises(ProtocolError) as error:
        messages(data, limit=limit)
    return error.value


def test_masked_text_and_binary_messages_read_back_whole() -> None:
    text = '{"observation": [0.1, 0.2], "tag": "é"}'
    data = frame(ws.OP_TEXT, text.encode()) + frame(ws.OP_BINARY, b"\x00\x01\xff", mask=b"\0\0\0\0")
    assert messages(data) == [(ws.OP_TEXT, text), (ws.OP_BINARY, b"\x00\x01\xff")]


@pytest.mark.parametrize("size", [125, 126, 65535, 65536])
def test_every_length_form_reads_in_pieces_as_it_does_whole(size: int) -> None:
    payload = os.urandom(size)
    data = frame(ws.OP_BINARY, payload, mask=os.urandom(4)) * 2
    assert messages(data, limit=1 << 20) == [(ws.OP_BINARY, payload)] * 2
    assert messages(data, chunk=7, limit=1 << 20) == [(ws.OP_BINARY, payload)] * 2


def test_a_fragmented_message_is_joined_and_control_frames_between_come_first() -> None:
    data = (frame(ws.OP_TEXT, b'{"obs', fin=False) + frame(ws.OP_PING, b"p1")
            + frame(ws.OP_CONTINUATION, b'ervation": ', fin=False) + frame(ws.OP_PONG, b"")
            + frame(ws.OP_CONTINUATION, b"[1]}"))
    expected = [(ws.OP_PING, b"p1"), (ws.OP_PONG, b""), (ws.OP_TEXT, '{"observation": [1]}')]
    assert messages(data) == expected
    assert messages(data, chunk=1) == expected


@pytest.mark.parametrize("data, code", [
    (frame(ws.OP_TEXT, b"x", masked=False), 1002),  # a client frame is masked
    (frame(ws.OP_TEXT, b"x", rsv=0x40), 1002),  # permessage-deflate was never accepted
    (frame(0x3, b"x"), 1002),  # reserved data opcode
    (frame(0xB, b""), 1002),  # reserved control opcode
    (frame(ws.OP_CONTINUATION, b"x"), 1002),  # nothing to continue
    (frame(ws.OP_TEXT, b"a", fin=False) + frame(ws.OP_BINARY, b"b"), 1002),  # a message inside a message
    (frame(ws.OP_PING, b"x", fin=False), 1002),  # control frames are never fragmented
    (frame(ws.OP_PING, b"x" * 126), 1002),  # nor longer than 125 bytes
    (frame(ws.OP_TEXT, b"\xff\xfe"), 1007),  # text is UTF-8
    (frame(ws.OP_TEXT, b"\xc3", fin=False) + frame(ws.OP_CONTINUATION, b"x"), 1007),
    (frame(ws.OP_CLOSE, b"\x03"), 1002),  # a close frame of one byte
    (frame(ws.OP_CLOSE, struct.pack("!H", 1005)), 1002),  # a code no endpoint sends
    (frame(ws.OP_CLOSE, struct.pack("!H", 999)), 1002),
    (frame(ws.OP_CLOSE, struct.pack("!H", 2000)), 1002),
    (frame(ws.OP_CLOSE, struct.pack("!H", 1000) + b"\xff"), 1007),  # the reason is UTF-8
])
def test_frames_a_client_may_not_send_fail_the_connection_with_their_code(data: bytes, code: int) -> None:
    assert refused(data).code == code


def test_a_64_bit_length_with_its_top_bit_set_is_refused_before_any_payload() -> None:
    data = struct.pack("!BBQ", 0x82, 0xFF, 1 << 63) + b"\0\0\0\0"
    assert refused(data, limit=1 << 62).code == 1002


def test_an_oversized_message_is_refused_by_its_header_before_its_bytes_come() -> None:
    parser = FrameParser(LIMIT)
    parser.feed(frame(ws.OP_BINARY, b"x" * (LIMIT + 1))[:8])  # the header only
    with pytest.raises(TooBig) as error:
        parser.next()
    assert (error.value.code, error.value.opcode, error.value.size) == (1009, ws.OP_BINARY, LIMIT + 1)
    assert messages(frame(ws.OP_TEXT, b"x" * LIMIT)) == [(ws.OP_TEXT, "x" * LIMIT)]  # the limit itself is fine


def test_fragments_count_together_toward_the_limit() -> None:
    half = b"x" * (LIMIT // 2 + 1)
    data = frame(ws.OP_TEXT, half, fin=False) + frame(ws.OP_CONTINUATION, half)
    error = refused(data)
    assert isinstance(error, TooBig) and error.opcode == ws.OP_TEXT and error.size == 2 * len(half)
    # a finished message's bytes do not count toward the next one's
    assert len(messages(frame(ws.OP_TEXT, half) + frame(ws.OP_TEXT, half))) == 2


@pytest.mark.parametrize("payload, code", [
    (b"", 1005), (struct.pack("!H", 1000), 1000), (struct.pack("!H", 1001) + b"bye", 1001),
    (struct.pack("!H", 3000), 3000), (struct.pack("!H", 4999), 4999)])
def test_a_close_frame_reads_as_its_code(payload: bytes, code: int) -> None:
    assert messages(frame(ws.OP_CLOSE, payload)) == [(ws.OP_CLOSE, code)]


def test_server_frames_are_unmasked_with_the_shortest_length_form() -> None:
    assert ws.encode(ws.OP_TEXT, b"hi") == b"\x81\x02hi"
    assert ws.encode(ws.OP_BINARY, b"x" * 126)[:4] == b"\x82\x7e\x00\x7e"
    assert ws.encode(ws.OP_BINARY, b"x" * 65536)[:10] == b"\x82\x7f" + struct.pack("!Q", 65536)
    assert ws.close_frame(1009) == b"\x88\x02\x03\xf1"


def test_the_handshake_key_and_its_accept_value() -> None:
    key = b"dGhlIHNhbXBsZSBub25jZQ=="  # RFC 6455 section 1.3's example
    assert ws.valid_key(key) and ws.accept_key(key) == b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    assert not ws.valid_key(b"c2hvcnQ=") and not ws.valid_key(b"not base64!!") and not ws.valid_key(b"")


def test_random_bytes_only_ever_parse_or_fail_the_connection() -> None:
    """A fuzzer of the wire: frames with random headers, lengths and cuts either read as
    messages or raise ``ProtocolError`` (a close code), never anything else."""
    rng = random.Random(44)
    outcomes = set()
    for _ in range(1000):
        payload = rng.randbytes(rng.choice([0, 1, 5, 126, 300]))
        data = frame(rng.randrange(16), payload, fin=rng.random() < 0.7, rsv=rng.choice([0, 0, 0, 0x10]),
                     masked=rng.random() < 0.9) * rng.randint(1, 3)
        if rng.random() < 0.3:  # a cut or a flipped byte
            cut = rng.randrange(len(data))
            data = data[:cut] + bytes([rng.randrange(256)]) + data[cut + 1:]
        parser = FrameParser(rng.choice([64, 1000]))
        parser.feed(data)
        try:
            while parser.next() is not None:
                pass
            outcomes.add("read")
        except ProtocolError as error:
            assert error.code in (1002, 1007, 1009)
            outcomes.add(error.code)
    assert outcomes == {"read", 1002, 1007, 1009}
