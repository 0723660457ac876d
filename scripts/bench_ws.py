"""A stream's client for the benchmarks' load generators (``bench_server.run_load``'s
``stream``, ``bench_stream.py``): raw asyncio sockets and pre-encoded frames, as the HTTP
client sends pre-encoded requests, so that neither pays a client library's cost.
"""

from __future__ import annotations

import asyncio
import struct
import time


def ws_frame(data: bytes) -> bytes:
    """A client text frame, FIN set, masked with the zero key (the payload as it is)."""
    n = len(data)
    if n < 126:
        head = struct.pack("!BB", 0x81, 0x80 | n)
    elif n < 65536:
        head = struct.pack("!BBH", 0x81, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x81, 0x80 | 127, n)
    return head + b"\x00\x00\x00\x00" + data


async def ws_read(reader: asyncio.StreamReader) -> bytes:
    """One server frame's payload; a frame other than text raises."""
    first, second = await reader.readexactly(2)
    n = second & 0x7F
    if n == 126:
        n = struct.unpack("!H", await reader.readexactly(2))[0]
    elif n == 127:
        n = struct.unpack("!Q", await reader.readexactly(8))[0]
    payload = await reader.readexactly(n)
    if first & 0x0F != 0x1:
        raise RuntimeError(f"stream frame opcode {first & 0x0F}: {payload[:200]!r}")
    return payload


async def ws_connection(port: int, messages: list[bytes], stop_at: float, warm_until: float,
                         latencies: list[float], errors: list[int], total: list[int]) -> None:
    """A stream's client: ``messages[0]`` is the upgrade request, the rest pre-encoded frames
    sent in a closed loop (one in flight) as ``bench_server._connection`` sends requests; the first frame
    is sent once, the others in turn."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(messages[0])
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 101"):
        raise RuntimeError(f"stream upgrade refused: {head[:200]!r}")
    frames = messages[1:]
    i = 0
    while (now := time.perf_counter()) < stop_at:
        writer.write(frames[i] if i < len(frames) else frames[1 + (i - 1) % (len(frames) - 1)])
        i += 1
        answer = await ws_read(reader)
        done = time.perf_counter()
        total[0] += 1
        if warm_until < done <= stop_at:
            latencies.append(done - now)
            if answer.startswith(b'{"error"') or b'"status":' in answer[:300]:
                errors.append(400)
    writer.close()
