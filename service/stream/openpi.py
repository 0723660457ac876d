"""openpi's policy-server protocol: what ``openpi_client.WebsocketClientPolicy`` speaks.

    connect ─► the server's metadata (one msgpack map) ─► per ``infer(obs)``: one binary
      msgpack map in (numpy arrays as ``msgpack_numpy`` maps) ─► one binary map out

Its observation dict maps to a stream step (``frames.StepMessage``): the observation is the
value under the stream's observation key (``observation`` unless the upgrade names another
with ``observation_key``), or, for a model whose observation space is a Dict, the dict's
other keys when that key is absent; the step message's own keys (``reward``,
``terminated``, ``episode_start``, ``seed``, ...) keep their meaning; any other key is
ignored, as openpi's policies ignore what their input transforms do not read. The answer is
the act answer with the action as numpy under ``actions`` (openpi's key) and the server's
time in ``server_timing``. A refusal is a text frame holding the JSON error body, which
openpi's client raises as ``RuntimeError``; the connection stays open (docs/api.md
"openpi's protocol").
"""

from __future__ import annotations

import functools
import time
from typing import Any

import msgpack  # type: ignore[import-untyped]  # ships no type information
import msgspec
import numpy as np
from gymnasium import spaces as gs

from rlserve.service.errors import BadRequest, ServiceError
from rlserve.service.serving.policy import Policy
from rlserve.service.step.codec import decode_value
from rlserve.service.stream import frames

OBSERVATION_KEY = "observation"
# The step message's fields other than the observation: read from the dict when present.
STEP_KEYS = frozenset(frames.StepMessage.__struct_fields__) - {"observation"}


class OpenpiFrames:
    """The dialect of one openpi connection (``connection.Dialect``)."""

    label = "openpi"

    def __init__(self, route: str, observation_key: str, dict_space: bool):
        self.route = route  # "/v1/models/{name}/openpi", or "/" for RLSERVE_OPENPI_MODEL's
        self.key = observation_key
        self.dict_space = dict_space  # the model's observation is a Dict: the dict may be it

    def decode(self, kind: str, data: str | bytes) -> frames.StepMessage:
        if kind == frames.TEXT:
            raise frames.Unreadable("openpi messages are binary msgpack frames", field="message",
                                    expected="a binary frame: a msgpack map", received="a text frame")
        fields = frames.unpack(data)
        step = {name: value for name, value in fields.items() if name in STEP_KEYS}
        if self.key in fields:
            step["observation"] = fields[self.key]
        elif self.dict_space:
            step["observation"] = {name: value for name, value in fields.items() if name not in STEP_KEYS}
        elif not step.get("end"):
            raise BadRequest(f"the observation dict has no key {self.key!r}", field=self.key,
                             expected=f"the model's observation under {self.key!r} (the upgrade's observation_key)",
                             received=f"keys {sorted(fields)[:16]}")
        return frames.convert(step)

    @staticmethod
    def answer(kind: str, response: msgspec.Struct, tag: str | int | None, action_space: gs.Space,
               started: float) -> dict[str, Any]:
        payload: dict[str, Any] = msgspec.to_builtins(response)
        payload["actions"] = as_numpy(decode_value(action_space, payload.pop("action"), "action"))
        if tag is not None:
            payload["tag"] = tag
        payload["server_timing"] = {"infer_ms": (time.perf_counter() - started) * 1e3}
        return binary(payload)

    @staticmethod
    def error(kind: str, exc: ServiceError, tag: str | int | None) -> dict[str, Any]:
        """A text frame: openpi's client raises it (``RuntimeError: Error in inference server``)."""
        return frames.error(frames.TEXT, exc, tag)

    @staticmethod
    def frame(kind: str, payload: dict[str, Any]) -> dict[str, Any]:
        return binary(payload)


def metadata(policy: Policy, session_id: str, observation_key: str) -> dict[str, Any]:
    """The map sent on connect (openpi's server sends its policy's metadata there)."""
    data = policy.bundle.manifest.data
    return {"server": "rlserve", "model": policy.name, "version": policy.version, "session_id": session_id,
            "observation_key": observation_key, "observation_space": data["observation_space"],
            "action_space": data["action_space"]}


def binary(payload: dict[str, Any]) -> dict[str, Any]:
    """The ASGI send message of ``payload`` as msgpack, numpy as ``msgpack_numpy`` maps."""
    return {"type": "websocket.send", "bytes": msgpack.packb(payload, default=_ndarray_map)}


def _ndarray_map(obj: Any) -> Any:
    """msgpack's hook for numpy: the map openpi's client reads back (bin keys, as it writes them)."""
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot pack {type(obj).__name__}")


@functools.singledispatch
def as_numpy(value: Any) -> Any:
    """A decoded action (``codec.decode_value``) with every leaf a numpy array."""
    return np.asarray(value)


@as_numpy.register
def _(value: dict) -> dict:
    return {key: as_numpy(item) for key, item in value.items()}


@as_numpy.register
def _(value: tuple) -> list:
    return [as_numpy(item) for item in value]


@as_numpy.register
def _(value: list) -> list:  # a Repeated space's items
    return [as_numpy(item) for item in value]
