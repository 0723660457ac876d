"""A multi-agent episode as bytes (service/sessions/episode_record.py): an import is read
whole or refused with a RecordError, whatever its bytes."""

from __future__ import annotations

import msgspec
import pytest

from rlserve.service.sessions.episode_record import decode_episode, encode_episode
from rlserve.service.sessions.episode_store import Episode, Seat
from rlserve.service.sessions.record import RecordError


def _exported() -> dict:
    episode = Episode("e", 7, 0.0, 0.0, seats={"red_1": Seat("p", "e#red_1")}, joins={"red_1": 2}, steps=5)
    return msgspec.msgpack.decode(encode_episode(episode, {"red_1": b"record"}))


def test_an_export_reads_back():
    record = decode_episode(msgspec.msgpack.encode(_exported()))
    assert (record.id, record.seed, record.steps, record.joins, record.records) == (
        "e", 7, 5, {"red_1": 2}, {"red_1": b"record"})


@pytest.mark.parametrize(("key", "value"), [
    ("steps", -1), ("steps", (1 << 64) - 1), ("steps", 1.5), ("steps", True), ("steps", "3"),
    ("joins", {"red_1": -1}), ("joins", {"red_1": (1 << 64) - 1}), ("joins", {"red_1": "2"}),
])
def test_counts_it_cannot_go_on_from_are_refused(key, value):
    body = _exported()
    body[key] = value
    with pytest.raises(RecordError):
        decode_episode(msgspec.msgpack.encode(body))


def test_invalid_utf8_in_a_string_is_refused():
    data = msgspec.msgpack.encode(_exported()).replace(b"e#red_1", b"e#r\xffd_1")
    with pytest.raises(RecordError):
        decode_episode(data)
