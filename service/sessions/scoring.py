"""A session's running episode, for the per-version live results: its return and length.

From what a client already sends on the act path, per session row of a bound request:

- a row that starts an episode (a new session, or ``episode_start`` on a live one): the
  live session's previous episode finishes (if this process scored it), a new one starts;
- any other row adds its ``reward`` (the previous step's) to the return; a row that ends
  the episode (``terminated``/``truncated``) finishes it with its reward, without counting
  its own step (its action is never played), and no later row of the session is scored
  until the next start;
- a session ended (the session route's DELETE, KServe ``sequence_end``, a policy set's
  finishing agent) finishes its episode if it is still open.

The length is the number of the episode's steps answered before its end marker. An episode
is scored only where this process saw it from its start and saw every step: a session read
from an external store (a restart, another replica), or one whose step count moved past
what this process last saw (a step served elsewhere, a retried step), is not scored, so a
partial return never counts as a whole one. The running totals live on the ``Session``
object in this process, not in its record: that is what "seen from its start here" means.

``finish(version, return, length)`` is the lifecycle's ``on_episode`` listener.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from rlserve.service.sessions.store import Session

# finish(version, episode return, episode length)
Finish = Callable[[str, float, int], None]


def start(session: Session, finish: Finish) -> None:
    """``session`` starts an episode with this row (the row's own step counted)."""
    if session.scored and session.episode_length:
        finish(session.version, session.episode_return, session.episode_length)
    session.scored, session.episode_return, session.episode_length, session.seen_steps = True, 0.0, 1, 0


def step(session: Session, reward: float | None, end: int, finish: Finish) -> None:
    """A row of ``session`` that continues its episode: ``reward`` the previous step's
    (None: not sent), ``end`` 1/2 when this observation ends the episode."""
    if not session.scored:
        return
    if session.steps != session.seen_steps + 1:  # a step this process did not see
        session.scored = False
        return
    session.seen_steps = session.steps
    if reward is not None:
        session.episode_return += reward
    if end:
        session.scored = False
        finish(session.version, session.episode_return, session.episode_length)
    else:
        session.episode_length += 1


def ended(session: Session, finish: Finish) -> None:
    """``session`` ends: its open episode (if this process scored it) finishes."""
    if session.scored and session.episode_length:
        session.scored = False
        finish(session.version, session.episode_return, session.episode_length)


def rows(sessions: Sequence[Session | None], starts: Sequence[bool], rewards: Sequence[float | None],
         ends: Sequence[int] | None, finish: Finish) -> None:
    """Every session row of one bound request."""
    for row, session in enumerate(sessions):
        if session is None:
            continue
        if starts[row]:
            start(session, finish)
        else:
            reward = rewards[row]
            step(session, None if reward is None or not math.isfinite(reward) else float(reward),
                 0 if ends is None else ends[row], finish)
