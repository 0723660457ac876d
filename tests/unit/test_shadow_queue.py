"""The shadow's queue: bounded, drops counted, a session broken by a drop skipped until its
next episode start, and no session twice in one candidate batch."""

from __future__ import annotations

import numpy as np
import pytest

from rlserve.service.shadow.queue import ShadowQueue
from rlserve.service.shadow.rows import ShadowRow


def _row(session: str | None, reset: bool = False, end: int = 0) -> ShadowRow:
    return ShadowRow(session, reset, [0.0], np.zeros((1, 2), np.float32), None, None, None, True, end, None, 0.0)


def test_a_full_queue_drops_and_counts_and_keeps_what_fits():
    queue = ShadowQueue(2)
    queue.offer([_row("a", reset=True), _row("b", reset=True), _row("c", reset=True)])
    assert len(queue) == 2
    assert (queue.counts.offered, queue.counts.dropped, queue.counts.skipped) == (3, 1, 0)
    assert [r.session_id for r in queue.take(10)] == ["a", "b"]


def test_a_dropped_row_breaks_its_session_until_the_next_episode_start():
    queue = ShadowQueue(1)
    queue.offer([_row("a", reset=True), _row("b", reset=True)])  # b's first row dropped
    queue.take(10)
    queue.offer([_row("b"), _row("b")])  # b's state is wrong now: skipped, not queued
    assert len(queue) == 0
    assert (queue.counts.dropped, queue.counts.skipped) == (1, 2)
    queue.offer([_row("b", reset=True)])  # a new episode: the candidate starts from its initial state
    queue.take(10)
    queue.offer([_row("b")])
    assert [r.session_id for r in queue.take(10)] == ["b"]
    assert queue.counts.skipped == 2


def test_an_episodes_last_row_dropped_breaks_nothing_and_stateless_rows_never_break():
    queue = ShadowQueue(1)
    queue.offer([_row("a", reset=True), _row("b", end=1), _row(None)])
    queue.take(10)
    queue.offer([_row("b"), _row(None)])  # b queued (not broken), the stateless row dropped again
    assert queue.counts.skipped == 0
    assert queue.counts.dropped == 3
    assert [r.session_id for r in queue.take(10)] == ["b"]


def test_a_candidate_batch_never_holds_a_session_twice():
    queue = ShadowQueue(10)
    queue.offer([_row("a", reset=True), _row(None), _row("b", reset=True), _row("a"), _row("b")])
    assert [r.session_id for r in queue.take(10)] == ["a", None, "b"]
    assert [r.session_id for r in queue.take(10)] == ["a", "b"]
    assert queue.take(10) == []


def test_a_closed_queue_drops_what_it_held_and_what_comes():
    queue = ShadowQueue(10)
    queue.offer([_row("a", reset=True)])
    assert queue.close() == 1
    queue.offer([_row("a")])
    assert len(queue) == 0 and queue.counts.dropped == 2


def test_a_queue_holds_at_least_one_row():
    with pytest.raises(ValueError, match="at least 1"):
        ShadowQueue(0)


def test_an_episode_starting_above_the_admission_mark_is_not_admitted_until_its_next_start():
    queue = ShadowQueue(4, admit_below=2)
    queue.offer([_row("a", reset=True), _row("b", reset=True), _row("c", reset=True)])  # c: 2 rows wait
    queue.offer([_row("a"), _row("c"), _row("b")])  # admitted episodes go on above the mark; c's rows skipped
    assert [r.session_id for r in queue._rows] == ["a", "b", "a", "b"]
    counts = queue.counts
    assert (counts.not_admitted, counts.dropped, counts.skipped) == (2, 0, 0)
    queue.offer([_row("a")])  # past the capacity: dropped, the admitted episode broken
    assert (counts.dropped, counts.skipped) == (1, 0)
    queue.take(10)
    queue.take(10)
    queue.offer([_row("c"), _row("c", reset=True), _row("c"), _row("a")])  # c's next episode finds room
    assert [r.session_id for r in queue.take(10)] == ["c"]
    assert (counts.not_admitted, counts.skipped) == (3, 1)
    assert [r.session_id for r in queue.take(10)] == ["c"]


def test_stateless_rows_are_admitted_only_below_the_mark_and_a_one_row_episode_marks_nothing():
    queue = ShadowQueue(3, admit_below=1)
    queue.offer([_row(None), _row(None), _row("a", reset=True, end=1)])
    assert len(queue) == 1 and queue.counts.not_admitted == 2
    queue.take(10)
    queue.offer([_row("a", reset=True), _row("a")])  # a's last episode was refused: its next start is admitted
    assert [r.session_id for r in queue.take(10)] == ["a"]


def test_a_batch_takes_every_waiting_session_past_a_repeated_one():
    queue = ShadowQueue(10)
    queue.offer([_row("a", reset=True), _row("a"), _row("b", reset=True), _row("a"), _row(None), _row("b")])
    assert [r.session_id for r in queue.take(10)] == ["a", "b", None]
    assert [r.session_id for r in queue.take(10)] == ["a", "b"]
    assert [r.session_id for r in queue.take(10)] == ["a"]


def test_rows_refused_by_a_closed_queue_are_counted_as_dropped():
    queue = ShadowQueue(10)
    queue.close()
    queue.refuse(3)
    assert (queue.counts.offered, queue.counts.dropped) == (3, 3)
