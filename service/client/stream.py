"""Streams: one WebSocket per environment, bound to one server session (docs/api.md "Streams").

``Stream`` (blocking) and ``AsyncStream`` open ``/v1/models/{name}/stream``; ``step`` sends
one observation and returns its ``ActResult``; ``send``/``receive`` pipeline several steps
(answers come back in order, with the ``tag`` each message carried). ``binary=True`` sends
msgpack frames with numpy arrays as openpi's ``msgpack_numpy`` writes them; else JSON text
frames. An error frame raises the ``RLServeError`` of its code, as an HTTP answer would, and
the stream stays usable.
"""

from __future__ import annotations

import json
from typing import Any, Self
from urllib.parse import urlencode

import msgpack  # type: ignore[import-untyped]  # ships no type information
import numpy as np
from websockets.asyncio.client import ClientConnection as AsyncConnection
from websockets.asyncio.client import connect as async_connect
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from rlserve.client.errors import ConnectionFailed, RLServeError, error_from_payload
from rlserve.client.wire import ActResult

__all__ = ["AsyncStream", "Stream", "pack_array", "stream_url"]

_UNSET: Any = object()


def stream_url(base_url: str, model: str, *, seed: int | None = None, explore: bool | None = None,
               version: str | None = None, outputs: tuple[str, ...] | list[str] = (),
               session_id: str | None = None, debug: bool = False) -> str:
    """The ``ws://`` (or ``wss://``) address of a stream with these options."""
    query: dict[str, str] = {}
    if seed is not None:
        query["seed"] = str(seed)
    if explore is not None:
        query["explore"] = "true" if explore else "false"
    if version is not None:
        query["version"] = version
    if outputs:
        query["outputs"] = ",".join(outputs)
    if session_id is not None:
        query["session_id"] = session_id
    if debug:
        query["debug"] = "true"
    base = base_url.rstrip("/")
    scheme, _, rest = base.partition("://")
    ws = {"http": "ws", "https": "wss"}.get(scheme, scheme)
    return f"{ws}://{rest}/v1/models/{model}/stream" + (f"?{urlencode(query)}" if query else "")


def pack_array(obj: Any) -> Any:
    """msgpack's ``default`` for numpy: openpi's ``msgpack_numpy`` form of an array."""
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": np.ascontiguousarray(obj).tobytes(), b"dtype": obj.dtype.str,
                b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot send {type(obj).__name__} in a msgpack frame")


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value


class _Frames:
    """Message building and answer reading, shared by both streams."""

    def __init__(self, binary: bool):
        self.binary = binary
        self.session_id: str | None = None

    def message(self, observation: Any, reward: float | None, terminated: bool, truncated: bool,
                action_mask: Any, prev_action: Any, tag: str | int | None, step: int | None) -> str | bytes:
        body: dict[str, Any] = {"observation": observation}
        if reward is not None:
            body["reward"] = float(reward)
        if terminated:
            body["terminated"] = True
        if truncated:
            body["truncated"] = True
        if action_mask is not None:
            body["action_mask"] = action_mask
        if prev_action is not _UNSET:
            body["prev_action"] = prev_action
        if tag is not None:
            body["tag"] = tag
        if step is not None:
            body["step"] = step
        return self.encode(body)

    def encode(self, body: dict[str, Any]) -> str | bytes:
        if self.binary:
            return msgpack.packb(body, default=pack_array)
        return json.dumps(_jsonable(body))

    def read(self, frame: str | bytes) -> dict[str, Any]:
        data = msgpack.unpackb(frame) if isinstance(frame, bytes) else json.loads(frame)
        if "error" in data:
            error = error_from_payload(data, data.get("status", 0))
            error.tag = data.get("tag")
            raise error
        return data

    def result(self, frame: str | bytes) -> ActResult:
        data = self.read(frame)
        self.session_id = data.get("session_id", self.session_id)
        return ActResult.from_json(data)


def _refused(exc: Exception, url: str) -> RLServeError:
    if isinstance(exc, InvalidStatus):
        response = exc.response
        try:
            payload = json.loads(bytes(response.body or b""))
        except ValueError:
            payload = {}
        return error_from_payload(payload, response.status_code)
    return ConnectionFailed(f"cannot open a stream at {url}: {exc}")


class _BlockingSocket:
    """A blocking stream's socket: connected when made, the ``end`` message, closing; the
    frames (``_Frames``) read the answers. ``Stream`` and ``AgentsStream`` are made of it."""

    def __init__(self, url: str, frames: _Frames, timeout: float, headers: dict[str, str] | None):
        self.url, self._frames, self._timeout = url, frames, timeout
        try:
            # legacy=True: the connection itself, kept past this call (websockets 17 warns otherwise)
            self._ws: ClientConnection = connect(url, open_timeout=timeout, max_size=None, compression=None,
                                                 additional_headers=headers, legacy=True)
        except (InvalidStatus, OSError, TimeoutError) as exc:
            raise _refused(exc, url) from None

    def end(self) -> None:
        """End the session or episode now (the server closes the stream once it is ended)."""
        self._ws.send(self._frames.encode({"end": True}))
        self._frames.read(self._ws.recv(timeout=self._timeout))
        self.close()

    def close(self) -> None:
        """Close the socket; the session or episode stays until it expires (or is resumed by id)."""
        self._ws.close()

    def __enter__(self) -> Self:
        """The stream itself; leaving the ``with`` block closes the socket."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the socket (the session or episode stays)."""
        self.close()


class _AsyncSocket:
    """An asyncio stream's socket: opened by ``open()`` or ``async with``, the ``end``
    message, closing. ``AsyncStream`` and ``AsyncAgentsStream`` are made of it."""

    def __init__(self, url: str, frames: _Frames, timeout: float, headers: dict[str, str] | None):
        self.url, self._frames, self._timeout, self._headers = url, frames, timeout, headers
        self._ws: AsyncConnection | None = None

    async def open(self) -> Self:
        """Connect (the upgrade's refusal raises its ``RLServeError``); returns the stream."""
        try:
            self._ws = await async_connect(self.url, open_timeout=self._timeout, max_size=None, compression=None,
                                           additional_headers=self._headers)
        except (InvalidStatus, OSError, TimeoutError) as exc:
            raise _refused(exc, self.url) from None
        return self

    def _socket(self) -> AsyncConnection:
        if self._ws is None:
            raise RuntimeError("the stream is not open: use `async with` or `await stream.open()`")
        return self._ws

    async def end(self) -> None:
        """End the session or episode now (the server closes the stream once it is ended)."""
        await self._socket().send(self._frames.encode({"end": True}))
        self._frames.read(await self._socket().recv())
        await self.close()

    async def close(self) -> None:
        """Close the socket; the session or episode stays until it expires (or is resumed by id)."""
        if self._ws is not None:
            await self._ws.close()

    async def __aenter__(self) -> Self:
        """The stream, opened."""
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        """Close the socket (the session or episode stays)."""
        await self.close()


class Stream(_BlockingSocket):
    """A blocking stream; a context manager (leaving it closes the socket, not the session)."""

    def __init__(self, base_url: str, model: str, *, binary: bool = False, timeout: float = 10.0,
                 headers: dict[str, str] | None = None, **options: Any):
        """Open a stream of ``model`` (options: ``seed``, ``explore``, ``version``,
        ``outputs``, ``session_id`` to resume a session, ``debug``)."""
        frames = _Frames(binary)
        frames.session_id = options.get("session_id")
        super().__init__(stream_url(base_url, model, **options), frames, timeout, headers)

    @property
    def session_id(self) -> str | None:
        """The session's id (known after the first answer, or given to resume it)."""
        return self._frames.session_id

    def send(self, observation: Any, *, reward: float | None = None, terminated: bool = False,
             truncated: bool = False, action_mask: Any = None, prev_action: Any = _UNSET,
             tag: str | int | None = None, step: int | None = None) -> None:
        """Send one step without waiting for its answer (``receive`` reads the answers in order)."""
        self._ws.send(self._frames.message(observation, reward, terminated, truncated, action_mask, prev_action,
                                           tag, step))

    def receive(self) -> ActResult:
        """The next answer; raises the ``RLServeError`` of an error frame."""
        return self._frames.result(self._ws.recv(timeout=self._timeout))

    def step(self, observation: Any, **fields: Any) -> ActResult:
        """One step: ``send`` then ``receive``."""
        self.send(observation, **fields)
        return self.receive()



class AsyncStream(_AsyncSocket):
    """An asyncio stream: ``async with AsyncStream(...) as stream`` (or ``await stream.open()``)."""

    def __init__(self, base_url: str, model: str, *, binary: bool = False, timeout: float = 10.0,
                 headers: dict[str, str] | None = None, **options: Any):
        """A stream of ``model``, opened by ``open()`` or ``async with``; options as ``Stream``'s."""
        frames = _Frames(binary)
        frames.session_id = options.get("session_id")
        super().__init__(stream_url(base_url, model, **options), frames, timeout, headers)

    @property
    def session_id(self) -> str | None:
        """The session's id (known after the first answer, or given to resume it)."""
        return self._frames.session_id

    async def send(self, observation: Any, *, reward: float | None = None, terminated: bool = False,
                   truncated: bool = False, action_mask: Any = None, prev_action: Any = _UNSET,
                   tag: str | int | None = None, step: int | None = None) -> None:
        """Send one step without waiting for its answer (``receive`` reads the answers in order)."""
        await self._socket().send(self._frames.message(observation, reward, terminated, truncated, action_mask,
                                                       prev_action, tag, step))

    async def receive(self) -> ActResult:
        """The next answer; raises the ``RLServeError`` of an error frame."""
        return self._frames.result(await self._socket().recv())

    async def step(self, observation: Any, **fields: Any) -> ActResult:
        """One step: ``send`` then ``receive``."""
        await self.send(observation, **fields)
        return await self.receive()
