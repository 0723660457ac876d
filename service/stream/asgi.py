"""A stream over an ASGI server's WebSocket (``websocket.receive``/``websocket.send``): the
transport of streams when the app runs under a server other than ``rlserve serve``'s
protocol (``socket.py``), or with ``RLSERVE_ACT_PROTOCOL`` off.

    receive (while fewer than ``max_inflight`` frames are unsent) ─► StreamConnection.take
      ─► AsgiOutlet (a queue) ─► writer task ─► send

Every message taken gives exactly one frame (its answer or error frame), so a semaphore of
``max_inflight`` taken at each receive and given back at each frame sent bounds what is
taken and not yet sent: while ``send`` blocks (a peer that does not read), the reader stops
receiving, the server stops reading the socket, and TCP pushes back on the client.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rlserve.service.stream import frames
from rlserve.service.stream.connection import StreamConnection

_CLOSE = object()  # the queue's mark before the close code


class AsgiOutlet:
    """``connection.Outlet`` onto an ASGI ``send``: frames queue for the writer task."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()

    def send(self, frame: dict[str, Any]) -> None:
        self.queue.put_nowait(frame)

    def close(self, code: int) -> None:
        self.queue.put_nowait(_CLOSE)
        self.queue.put_nowait(code)


async def run(connection: StreamConnection, outlet: AsgiOutlet, receive: Any, send: Any) -> None:
    """Serve ``connection`` until it closes or the client leaves."""
    room = asyncio.Semaphore(connection.limits.max_inflight)
    writer = asyncio.get_running_loop().create_task(_write(outlet, send, room))
    try:
        while not connection.closed:
            await room.acquire()
            if writer.done():  # the socket failed or closed: nothing more is sent
                break
            message = await receive()
            if message["type"] != "websocket.receive":  # websocket.disconnect: the client left
                writer.cancel()
                break
            text = message.get("text")
            if text is not None:
                connection.take(frames.TEXT, text)
            else:
                connection.take(frames.BINARY, message.get("bytes") or b"")
        await asyncio.wait([writer])  # what is queued is sent (or the client is gone)
    except asyncio.CancelledError:
        writer.cancel()
        raise
    finally:
        connection.lost()


async def _write(outlet: AsgiOutlet, send: Any, room: asyncio.Semaphore) -> None:
    """Send the frames in order; the close code is the last thing sent."""
    try:
        while True:
            item = await outlet.queue.get()
            if item is _CLOSE:
                await send({"type": "websocket.close", "code": await outlet.queue.get()})
                return
            await send(item)
            room.release()
    except OSError:  # the client is gone (uvicorn's ClientDisconnected): the reader sees it too
        return
    finally:
        room.release()  # a reader waiting for room wakes, sees the writer done, and stops
