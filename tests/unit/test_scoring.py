"""A session's running episode for the live results (``sessions/scoring.py``): what starts,
adds to and finishes an episode, and what makes one unscored."""

from __future__ import annotations

from rlserve.service.sessions import scoring
from rlserve.service.sessions.store import Session


def _session() -> Session:
    return Session("s", 1, None, None, 0.0, 0.0, version="2")


def _served(session: Session) -> None:
    session.steps += 1  # what the batch does once the row is answered


def test_an_episode_of_rewards_ending_with_terminated():
    done: list[tuple[str, float, int]] = []
    finish = lambda *a: done.append(a)  # noqa: E731
    s = _session()
    scoring.rows([s], [True], [None], None, finish)
    _served(s)
    for reward in (1.0, 0.5):
        scoring.rows([s], [False], [reward], None, finish)
        _served(s)
    scoring.rows([s], [False], [2.0], [1], finish)  # the last observation: its action is never played
    _served(s)
    assert done == [("2", 3.5, 3)]
    scoring.ended(s, finish)  # the client then ends the session: counted once
    scoring.rows([s], [False], [9.0], None, finish)
    assert done == [("2", 3.5, 3)]


def test_a_restart_or_an_end_finishes_the_open_episode():
    done: list[tuple[str, float, int]] = []
    finish = lambda *a: done.append(a)  # noqa: E731
    s = _session()
    scoring.start(s, finish)
    _served(s)
    scoring.step(s, 1.0, 0, finish)
    _served(s)
    scoring.rows([s], [True], [5.0], None, finish)  # episode_start on the live session
    s.steps = 1  # the batch restarts the count, then answers the row
    assert done == [("2", 1.0, 2)]
    scoring.step(s, 4.0, 0, finish)
    scoring.ended(s, finish)
    assert done == [("2", 1.0, 2), ("2", 4.0, 2)]


def test_a_step_served_elsewhere_leaves_the_episode_unscored():
    done: list[tuple[str, float, int]] = []
    finish = lambda *a: done.append(a)  # noqa: E731
    s = _session()
    scoring.start(s, finish)
    s.steps = 3  # two steps answered by another replica
    scoring.step(s, 1.0, 1, finish)
    scoring.ended(s, finish)
    adopted = _session()  # read from the store: never seen from its start here
    adopted.steps = 5
    scoring.step(adopted, 1.0, 1, finish)
    assert done == []
