"""A session as bytes (service/sessions/record.py): what goes in comes out, exactly."""

from __future__ import annotations

import numpy as np
import pytest

from rlserve.models.interface import ModelSignature, PrevSpec, StateSpec
from rlserve.service.sessions.record import (
    HEADER_BYTES,
    RecordError,
    SessionLayout,
    encode_sessions,
    record_version,
    with_revision,
)
from rlserve.service.sessions.slabs import SessionSlabs
from rlserve.service.sessions.store import Session

LSTM_256 = ModelSignature(obs_shape=(16,), num_outputs=4,
                          state=(StateSpec("h", (256,)), StateSpec("c", (256,))))
ATTENTION = ModelSignature(obs_shape=(4,), num_outputs=3, state=(StateSpec("memory", (3, 8)),),
                           prev=PrevSpec(n_prev_actions=2, n_prev_rewards=2, action_width=3, windowed=True))


def _session(slot: int, **fields) -> Session:
    return Session(id=f"s{slot}", slot=slot, seed=fields.pop("seed", None), rng=fields.pop("rng", None),
                   created=100.0, last_used=100.0, **fields)


@pytest.mark.parametrize("signature", [LSTM_256, ATTENTION], ids=["lstm256", "attention"])
def test_records_round_trip_every_field(signature):
    layout = SessionLayout(signature)
    slabs = SessionSlabs(signature, 8, 8)
    rng = np.random.default_rng(0)
    slots = np.array([2, 5])
    rows = [rng.standard_normal((2, *part.shape)).astype(part.dtype) for part in layout.parts]
    slabs.put_rows(slots, rows)
    seeded = np.random.default_rng(42)
    seeded.random(3)
    seeded.integers(0, 2**32, dtype=np.uint32)  # leaves a spare 32-bit draw in the generator
    sessions = [_session(2, seed=42, rng=seeded, steps=7, answer=b"\x93\x01\x02\x03"), _session(5, steps=0)]
    records = encode_sessions(layout, "v-1", sessions, [11, (1 << 64) - 1], slabs.rows(slots), now=100.0)
    first, second = (layout.decode(r) for r in records)
    assert (first.revision, first.version, first.steps, first.seed, first.answer) == (
        11, "v-1", 7, 42, b"\x93\x01\x02\x03")
    assert (second.revision, second.steps, second.seed, second.rng, second.answer) == (
        (1 << 64) - 1, 0, None, None, None)
    for part, got_a, got_b, want in zip(layout.parts, first.rows, second.rows, rows, strict=True):
        assert got_a.shape == part.shape
        np.testing.assert_array_equal(got_a, want[0])
        np.testing.assert_array_equal(got_b, want[1])
    # The generator continues exactly where the stored one was, spare 32 bits included.
    assert first.rng is not None
    assert first.rng.integers(0, 2**32, dtype=np.uint32) == seeded.integers(0, 2**32, dtype=np.uint32)
    np.testing.assert_array_equal(first.rng.random(5), seeded.random(5))
    assert record_version(records[0]) == "v-1"


def test_an_lstm256_record_is_compact():
    """2 KiB of state, an 80-byte header and the version: well under 1.5x the raw state."""
    layout = SessionLayout(LSTM_256)
    slabs = SessionSlabs(LSTM_256, 2, 2)
    [record] = encode_sessions(layout, "1", [_session(1)], [0], slabs.rows(np.array([1])), now=100.0)
    assert layout.payload_bytes == 2048
    assert len(record) == HEADER_BYTES + 1 + 2048


def test_records_that_do_not_fit_are_refused():
    layout = SessionLayout(LSTM_256)
    other = SessionLayout(ATTENTION)
    slabs = SessionSlabs(ATTENTION, 2, 2)
    [record] = encode_sessions(other, "1", [_session(1)], [0], slabs.rows(np.array([1])), now=100.0)
    with pytest.raises(RecordError, match="do not fit"):
        layout.decode(record)
    with pytest.raises(RecordError, match="bytes long"):
        other.decode(record[:-1])
    with pytest.raises(RecordError, match="header"):
        other.decode(record[:20])
    with pytest.raises(RecordError, match="format"):
        other.decode(record[:8] + b"\x07" + record[9:])
    assert other.decode(with_revision(record, 99)).revision == 99


def test_a_step_count_past_32_bits_is_stored_saturated():
    """The header counts steps in 32 bits: a session past that (an import near the limit that
    stepped on) is written at 2**32 - 1, not refused with the rest of its batch's records."""
    layout = SessionLayout(LSTM_256)
    slabs = SessionSlabs(LSTM_256, 4, 4)
    sessions = [_session(0, steps=(1 << 32) + 5), _session(1, steps=3)]
    records = encode_sessions(layout, "v", sessions, [1, 1], slabs.rows(np.array([0, 1])), now=100.0)
    assert [layout.decode(r).steps for r in records] == [(1 << 32) - 1, 3]
