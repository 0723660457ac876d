"""A stream's frames and upgrade options, in process: what each frame kind reads, and what it refuses.

The msgpack arrays are written by the client's ``pack_array`` (openpi's ``msgpack_numpy``
form) and by hand, byte for byte as docs/api.md "Streams" states them, so a client in
another language writing the documented bytes is read the same.
"""

from __future__ import annotations

import json

import msgpack
import numpy as np
import pytest

from rlserve.client.stream import pack_array, stream_url
from rlserve.service.errors import BadRequest
from rlserve.service.stream import frames
from rlserve.service.stream.route import stream_options


def _packed(body: dict) -> bytes:
    return msgpack.packb(body, default=pack_array)


def test_json_and_msgpack_read_the_same_step() -> None:
    obs = np.array([[0.5, -1.0], [2.0, 3.25]], dtype=np.float32)
    text = frames.decode(frames.TEXT, json.dumps({"observation": obs.tolist(), "reward": 1, "tag": "a"}))
    binary = frames.decode(frames.BINARY, _packed({"observation": obs, "reward": 1.0, "tag": "a"}))
    assert isinstance(binary.observation, np.ndarray) and binary.observation.dtype == np.float32
    np.testing.assert_array_equal(binary.observation, np.asarray(text.observation, dtype=np.float32))
    assert (text.reward, text.tag) == (binary.reward, binary.tag) == (1.0, "a")


def test_the_documented_bytes_of_an_array() -> None:
    """The map written by hand: str keys, a bin 'data' of little-endian C-order bytes."""
    data = np.arange(6, dtype="<i4").reshape(2, 3)
    by_hand = (b"\x81\xabobservation\x84\xab__ndarray__\xc3\xa4data\xc4\x18" + data.tobytes()
               + b"\xa5dtype\xa3<i4\xa5shape\x92\x02\x03")
    message = frames.decode(frames.BINARY, by_hand)
    np.testing.assert_array_equal(message.observation, data)


@pytest.mark.parametrize(("array", "field"), [
    ({b"__ndarray__": True, b"data": b"\x00" * 7, b"dtype": "<f4", b"shape": [2]}, "data"),  # bytes != shape
    ({b"__ndarray__": True, b"data": b"\x00" * 8, b"dtype": ">f4", b"shape": [2]}, "dtype"),  # big-endian
    ({b"__ndarray__": True, b"data": b"\x00" * 8, b"dtype": "|O", b"shape": [1]}, "dtype"),  # objects
    ({b"__ndarray__": True, b"data": b"", b"dtype": "<f4", b"shape": [1 << 62, 1 << 62, 0, -1]}, "shape"),
    ({b"__ndarray__": True, b"data": b"", b"dtype": "<f4", b"shape": [1 << 40, 1 << 40]}, "data"),  # no allocation
    ({b"__ndarray__": True, b"data": "text", b"dtype": "<f4", b"shape": [1]}, "data"),
])
def test_an_array_that_does_not_hold_together_is_unreadable(array: dict, field: str) -> None:
    with pytest.raises(frames.Unreadable) as refused:
        frames.decode(frames.BINARY, msgpack.packb({"observation": array}))
    assert refused.value.field == field


@pytest.mark.parametrize(("kind", "data", "field"), [
    (frames.TEXT, "{not json", None),
    (frames.TEXT, '{"observation": [1], "reward": "x"}', "reward"),
    (frames.TEXT, '{"observation": [1], "sesion_id": "x"}', "sesion_id"),
    (frames.TEXT, '[1, 2]', None),
    (frames.BINARY, b"\xc1", None),  # never used in msgpack
    (frames.BINARY, msgpack.packb([1, 2]), None),
    (frames.BINARY, msgpack.packb({"observation": [1], "terminated": "yes"}), "terminated"),
    (frames.BINARY, msgpack.packb({"observation": [1], "tag": "x" * 300}), "tag"),
])
def test_unreadable_messages_name_what_is_wrong(kind: str, data: str | bytes, field: str | None) -> None:
    with pytest.raises(frames.Unreadable) as refused:
        frames.decode(kind, data)
    if field is not None:
        assert refused.value.field == field
    assert refused.value.to_json()["error"]["expected"]


def test_answers_and_errors_keep_the_frame_kind_and_tag() -> None:
    error = frames.error(frames.BINARY, BadRequest("no", field="reward", expected="a number", received="x"), 7)
    payload = msgpack.unpackb(error["bytes"])
    assert payload["tag"] == 7 and payload["status"] == 400 and payload["error"]["field"] == "reward"
    text = frames.frame(frames.TEXT, {"ended": "s"})
    assert json.loads(text["text"]) == {"ended": "s"}


def test_options_of_the_upgrade() -> None:
    url = stream_url("http://h:1", "m", seed=3, explore=False, outputs=["value", "entropy"], debug=True)
    query = url.partition("?")[2].encode()
    options = stream_options(query)
    assert (options.seed, options.explore, options.outputs, options.debug, options.resume) == (
        3, False, ("value", "entropy"), True, False)
    assert len(options.session_id) == 32  # a new session's id
    resumed = stream_options(b"session_id=abc")
    assert (resumed.session_id, resumed.resume) == ("abc", True)


@pytest.mark.parametrize(("query", "field"), [
    (b"seed=-1", "seed"), (b"seed=x", "seed"), (b"explore=maybe", "explore"), (b"outputs=value,nope", "outputs"),
    (b"bogus=1", "bogus"), (b"seed=1&session_id=a", "seed"), (b"seed=1&seed=2", "seed"),
    (b"&".join([b"a=1"] * 50), "query"),
])
def test_options_refused(query: bytes, field: str) -> None:
    with pytest.raises(BadRequest) as refused:
        stream_options(query)
    assert refused.value.field == field
