"""A stream's frames: one step message in, one answer (or error) frame out.

Text frames are JSON; binary frames are msgpack, where a numpy array is the map that
openpi's ``msgpack_numpy`` writes (``{"__ndarray__": true, "data": <bin: the C-order
bytes>, "dtype": "<f4", "shape": [3, 4]}``, keys as msgpack bin or str). docs/api.md
"Streams" states both byte for byte. An answer goes back in the frame kind of its request.

A message that cannot be read (not JSON or msgpack, not a map, a field of the wrong type,
an array whose bytes do not match its dtype and shape) raises ``Unreadable``: the
connection counts those (``connection.py``). The step itself (does the observation fit
the model) is the act path's to refuse.
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any

import msgpack  # type: ignore[import-untyped]  # ships no type information
import msgspec
import numpy as np

from rlserve.service.act.msgspec_errors import explain, unknown_field
from rlserve.service.act.wire import Seed, StepIndex, dec_hook
from rlserve.service.errors import BadRequest, ServiceError

TEXT, BINARY = "text", "bytes"  # the ASGI message key of each frame kind
MAX_TAG = 256  # characters of a string tag
MAX_DIMS = 32  # numpy's own limit on an array's dimensions
# The dtypes an array may have: little-endian ('<') or byte-order-free ('|') bool, int,
# unsigned and float numbers (what numpy's dtype.str writes for them on every common machine).
_DTYPE = re.compile(r"^(\|b1|\|[iu]1|<[iu][248]|<f[248])$")


class Unreadable(BadRequest):
    """A message that cannot be read as a step message (counted per connection)."""


class StepMessage(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One step of the stream's session, or ``end``."""

    observation: Any = msgspec.UNSET
    reward: float | None = None
    terminated: bool = False
    truncated: bool = False
    action_mask: Any = None
    prev_action: Any = msgspec.UNSET
    step: StepIndex | None = None  # the retry index of the act route's `step`
    episode_start: bool = False  # start a new episode with this step (as after a terminated one)
    seed: Seed | None = None  # seeds the episode this step starts
    tag: Annotated[str, msgspec.Meta(max_length=MAX_TAG)] | int | None = None
    end: bool = False  # end the session now (no observation)


_JSON = msgspec.json.Decoder(StepMessage, dec_hook=dec_hook)
_SCHEMA = "the stream step message"
_EXPECTED = ("a JSON object (text frame) or msgpack map (binary frame) with the keys "
             f"{list(StepMessage.__struct_fields__)}")


def decode(kind: str, data: str | bytes) -> StepMessage:
    """A frame's text or bytes as a step message; ``Unreadable`` if they are none."""
    if kind == TEXT:
        return _from_json(data)
    return _from_msgpack(data)


def _from_json(data: str | bytes) -> StepMessage:
    try:
        return _JSON.decode(data)
    except msgspec.ValidationError as exc:
        raise _refusal(str(exc), data.encode() if isinstance(data, str) else data) from None
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise Unreadable(f"message is not valid JSON: {exc}", expected=_EXPECTED,
                         received=f"{len(data)} bytes that do not parse") from None


def _from_msgpack(data: str | bytes) -> StepMessage:
    return convert(unpack(data))


def unpack(data: str | bytes) -> dict[str, Any]:
    """A binary frame as a map of str keys (bin keys decoded), arrays as numpy."""
    try:
        obj = msgpack.unpackb(data, object_hook=_ndarray, raw=False)
    except Unreadable:
        raise
    except Exception as exc:  # msgpack's own errors (ExtraData, FormatError, StackError, ValueError ...)
        raise Unreadable(f"message is not valid msgpack: {type(exc).__name__}", expected=_EXPECTED,
                         received=f"{len(data)} bytes that do not unpack") from None
    if not isinstance(obj, dict):
        raise Unreadable("message is not a msgpack map", expected=_EXPECTED, received=type(obj).__name__)
    fields = {}
    for key, value in obj.items():
        name = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
        if not isinstance(name, str):
            raise Unreadable("a key of the message is not a string", field="message", expected="string keys",
                             received=type(name).__name__)
        fields[name] = value
    return fields


def convert(fields: dict[str, Any]) -> StepMessage:
    """An unpacked map as a step message; ``Unreadable`` naming the field that does not fit."""
    try:
        return msgspec.convert(fields, StepMessage, dec_hook=dec_hook)
    except msgspec.ValidationError as exc:
        raise _refusal(str(exc), b"") from None


def _refusal(message: str, body: bytes) -> Unreadable:
    name = unknown_field(message)
    if name is not None:
        return Unreadable(f"invalid message: unknown field {name!r}", field=name,
                          expected=f"one of {list(StepMessage.__struct_fields__)}", received=name)
    plain = explain(message, body, schema=_SCHEMA)
    return Unreadable(plain.message, field=plain.field, expected=plain.expected, received=plain.received)


def _key(obj: dict[Any, Any], name: str) -> Any:
    value = obj.get(name.encode())
    return obj.get(name) if value is None else value


def _ndarray(obj: dict[Any, Any]) -> Any:
    """msgpack's object hook: an ``__ndarray__`` (or ``__npgeneric__``) map as numpy."""
    if _key(obj, "__ndarray__") is None:
        if _key(obj, "__npgeneric__") is not None:
            return _scalar(obj)
        return obj
    data, dtype, shape = _key(obj, "data"), _dtype(_key(obj, "dtype")), _key(obj, "shape")
    if not isinstance(data, bytes):
        raise Unreadable("an array's 'data' is not bytes", field="data", expected="msgpack bin",
                         received=type(data).__name__)
    if (not isinstance(shape, list | tuple) or len(shape) > MAX_DIMS
            or not all(type(n) is int and n >= 0 for n in shape)):
        raise Unreadable("an array's 'shape' is not a list of sizes", field="shape",
                         expected=f"up to {MAX_DIMS} non-negative integers", received=str(shape)[:80])
    expected = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
    if expected != len(data):
        raise Unreadable(f"an array of shape {list(shape)[:8]} and dtype {dtype.str} holds {expected} bytes",
                         field="data", expected=f"{expected} bytes", received=len(data))
    return np.frombuffer(data, dtype).reshape(shape)


def _scalar(obj: dict[Any, Any]) -> Any:
    value = _key(obj, "data")
    if not isinstance(value, bool | int | float):
        raise Unreadable("a numpy scalar's 'data' is not a number", field="data", expected="a number",
                         received=type(value).__name__)
    _dtype(_key(obj, "dtype"))
    return value


def _dtype(value: Any) -> np.dtype:
    text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
    if not isinstance(text, str) or not _DTYPE.match(text):
        raise Unreadable("an array's 'dtype' is not one this server reads", field="dtype",
                         expected="one of |b1 |i1 |u1 <i2 <i4 <i8 <u2 <u4 <u8 <f2 <f4 <f8", received=str(text)[:40])
    return np.dtype(text)


# --------------------------------------------------------------------------- answers

_JSON_ENCODE = msgspec.json.Encoder().encode
_MSGPACK_ENCODE = msgspec.msgpack.Encoder().encode


def frame(kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The ASGI send message of ``payload`` in frame kind ``kind``."""
    if kind == TEXT:
        return {"type": "websocket.send", "text": _JSON_ENCODE(payload).decode()}
    try:
        return {"type": "websocket.send", "bytes": _MSGPACK_ENCODE(payload)}
    except OverflowError:  # an error echoing an integer past 64 bits, which msgpack cannot hold: as text
        text = json.loads(_JSON_ENCODE(payload), parse_int=lambda digits: int(digits) if len(digits) < 19 else digits)
        return {"type": "websocket.send", "bytes": _MSGPACK_ENCODE(text)}


def answer(kind: str, response: msgspec.Struct, tag: str | int | None) -> dict[str, Any]:
    """An act answer (``ActResponse``) with the message's tag."""
    payload = msgspec.to_builtins(response)
    if tag is not None:
        payload["tag"] = tag
    return frame(kind, payload)


def error(kind: str, exc: ServiceError, tag: str | int | None) -> dict[str, Any]:
    """The HTTP error body of ``exc``, with its status and the message's tag."""
    payload: dict[str, Any] = exc.to_json()
    payload["status"] = exc.status
    if tag is not None:
        payload["tag"] = tag
    return frame(kind, payload)



class StreamFrames:
    """The dialect of ``/v1/models/{name}/stream`` (what ``StreamConnection`` reads and writes
    with): JSON text or msgpack frames, each answer in the kind of its message."""

    route = "/v1/models/{name}/stream"  # the access log's name of the route
    label = "stream"  # rlserve_request_latency_seconds{route=...}
    decode = staticmethod(decode)
    error = staticmethod(error)
    frame = staticmethod(frame)

    @staticmethod
    def answer(kind: str, response: msgspec.Struct, tag: str | int | None, action_space: Any,
               started: float) -> dict[str, Any]:
        return answer(kind, response, tag)


STREAM = StreamFrames()
