"""The open step travels in the session's record: a replica that reads the record closes it."""

from __future__ import annotations

import numpy as np

from rlserve.models.interface import ModelSignature, StateSpec
from rlserve.service.experience import trail as trails
from rlserve.service.experience.trail import NOT_SAMPLED, Trail
from rlserve.service.sessions.record import SessionLayout, encode_sessions
from rlserve.service.sessions.store import Session

LSTM = ModelSignature(obs_shape=(2,), num_outputs=2, state=(StateSpec("h", (8,)), StateSpec("c", (8,))))
STEP = Trail("s:ab-1", 7, "ab-9", np.array([0.25, -1.5], np.float32).tobytes(), 1, None, -0.693, 0.5, True, "3",
             1_700_000_000.25)


def _record(session: Session, layout: SessionLayout) -> bytes:
    rows = [np.full((1, *part.shape), 0.5, part.dtype) for part in layout.parts]
    return encode_sessions(layout, "3", [session], [11], rows, now=100.0)[0]


def test_a_trail_object_is_written_as_bytes_and_read_back_equal():
    layout = SessionLayout(LSTM)
    session = Session("s", 1, None, None, 100.0, 100.0, steps=8, answer=b"\x91\x07", trail=STEP)
    record = layout.decode(_record(session, layout))
    assert record.answer == b"\x91\x07" and record.steps == 8
    assert trails.decode(record.trail) == STEP
    assert trails.decode(STEP) is STEP  # held here: never encoded on the way


def test_records_without_a_trail_and_sessions_not_sampled():
    layout = SessionLayout(LSTM)
    plain = layout.decode(_record(Session("s", 1, None, None, 100.0, 100.0), layout))
    assert plain.trail is None and plain.answer is None
    marked = layout.decode(_record(Session("s", 1, None, None, 100.0, 100.0, trail=NOT_SAMPLED), layout))
    assert marked.trail == NOT_SAMPLED and trails.decode(marked.trail) is None
    assert trails.decode(b"\xc1 not msgpack") is None  # another release's bytes: the step is not logged
