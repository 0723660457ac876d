"""The shadow's bounded queue, and the rule for a session whose row was dropped.

Two sides use it. In the server, ``admit`` decides per hand-over (a ``RowBatch``) which
rows go to the candidate's process (a lock and a loop over the rows): rows waiting for the
candidate (handed over, not yet taken into a candidate batch) are at most ``capacity``; past that,
rows are dropped and counted, so the live request never waits for the shadow. Rows the
hand-over itself refused (``lost``) are dropped the same way. In the candidate's process
the queue holds what arrived (``offer``) until the runner takes a batch (``take``).

A dropped row of a session breaks that session's shadow state (the candidate would never
see the step, and its recurrent state and previous action would go wrong). The rule: the
session is marked broken, and its later rows are skipped (counted) until a row starts a
new episode (``reset``: ``episode_start``, a new session), which the candidate can run
from its initial state again. The marks are bounded (``MAX_BROKEN``, the oldest forgotten:
such a session's rows then reach the runner, which skips a session it holds no state for
until its next episode start, the same rule).

So that the rows scored form whole episodes, a queue with an admission mark
(``admit_below``, the server's: half its capacity) lets an episode in only at its start and
only while fewer rows than the mark wait: an episode that starts above it is not admitted,
and its rows are skipped (counted apart, ``not_admitted``) until the session's next episode
start, where it may be admitted. An admitted episode keeps being fed up to the capacity: the
rows between the mark and the capacity are the admitted episodes' room, so a drop, which
breaks an episode mid-way, needs a backlog past the capacity. A stateless row is an episode
of its own. Without a mark (the candidate's process's queue) every row is taken while it fits.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass

from rlserve.service.shadow.rows import RowBatch, ShadowRow

MAX_BROKEN = 100_000


@dataclass
class QueueCounts:
    offered: int = 0  # rows that reached ``offer`` or ``admit``
    dropped: int = 0  # rows dropped because the queue was full (or the hand-over refused them)
    skipped: int = 0  # later rows of a session broken by a drop, skipped until its next episode
    not_admitted: int = 0  # rows of an episode that started above the admission mark


class ShadowQueue:
    def __init__(self, capacity: int, admit_below: int | None = None):
        if capacity < 1:
            raise ValueError(f"a shadow queue holds at least 1 row, not {capacity}")
        self.capacity = capacity
        self.admit_below = admit_below  # None: no admission rule, every row taken while it fits
        self.counts = QueueCounts()
        self.admitted = 0  # rows ``admit`` let through, less those ``lost``
        self._rows: deque[ShadowRow] = deque()
        self._lock = threading.Lock()
        self._broken: OrderedDict[str, None] = OrderedDict()
        self._refused: OrderedDict[str, None] = OrderedDict()  # sessions whose episode was not admitted
        self.closed = False

    def __len__(self) -> int:
        return len(self._rows)

    def offer(self, rows: list[ShadowRow]) -> None:
        """Queue ``rows`` (in order), dropping what does not fit and skipping broken sessions."""
        with self._lock:
            keep = self._admit([(r.session_id, r.reset, r.end) for r in rows], len(self._rows))
            self._rows.extend(rows[i] for i in keep)

    def admit(self, batch: RowBatch, taken: int) -> RowBatch | None:
        """The rows of ``batch`` to hand over (None: none), when the other side took ``taken``
        of those admitted so far: what does not fit is dropped, broken sessions skipped."""
        with self._lock:
            keep = self._admit(zip(batch.sessions, batch.reset, batch.ends, strict=True), self.admitted - taken)
            self.admitted += len(keep)
        return batch.take(keep) if keep else None

    def refuse(self, rows: int) -> None:
        """``rows`` offered to a closed queue: dropped (counted) without being looked at."""
        with self._lock:
            self.counts.offered += rows
            self.counts.dropped += rows

    def lost(self, batch: RowBatch) -> None:
        """Rows admitted but never handed over: dropped, their sessions broken."""
        with self._lock:
            self.admitted -= len(batch)
            for session, end in zip(batch.sessions, batch.ends, strict=True):
                self._drop(session, end)

    def _admit(self, rows: Iterable[tuple[str | None, bool, int]], held: int) -> list[int]:
        """The indices of ``rows`` (session, reset, end) that fit beside ``held`` rows waiting."""
        counts, broken, refused = self.counts, self._broken, self._refused
        capacity, mark = self.capacity, self.admit_below
        keep: list[int] = []
        for index, (session, reset, end) in enumerate(rows):
            counts.offered += 1
            if self.closed:
                counts.dropped += 1
                continue
            if reset or session is None:
                if session is not None and (broken or refused):
                    broken.pop(session, None)
                    refused.pop(session, None)
                if mark is not None and held + len(keep) >= mark:  # a new episode, above the mark
                    counts.not_admitted += 1
                    if session is not None and not end:
                        _mark(refused, session)
                    continue
            elif broken and session in broken:
                counts.skipped += 1
                continue
            elif refused and session in refused:
                counts.not_admitted += 1
                continue
            if held + len(keep) >= capacity:
                self._drop(session, end)
                continue
            keep.append(index)
        return keep

    def _drop(self, session: str | None, end: int) -> None:
        self.counts.dropped += 1
        if session is not None and not end:  # an episode's last row breaks nothing after it
            _mark(self._broken, session)

    def take(self, limit: int) -> list[ShadowRow]:
        """Up to ``limit`` rows, oldest first, with no session twice (a session's next row
        needs the state its previous one leaves): a session's later rows stay queued, in
        order, for a later batch, and the rows behind them are taken (looking at no more
        than ``4 * limit`` rows), so a batch holds every session that waits, not only those
        before the first repeated one."""
        taken: list[ShadowRow] = []
        later: list[ShadowRow] = []
        seen: set[str] = set()
        with self._lock:
            queue = self._rows
            looked = 0
            while queue and len(taken) < limit and looked < 4 * limit:
                row = queue.popleft()
                looked += 1
                session = row.session_id
                if session is not None:
                    if session in seen:
                        later.append(row)
                        continue
                    seen.add(session)
                taken.append(row)
            queue.extendleft(reversed(later))
        return taken

    def close(self) -> int:
        """Refuse further rows; how many queued rows were let go (counted as dropped)."""
        with self._lock:
            self.closed = True
            left = len(self._rows)
            self._rows.clear()
            self.counts.dropped += left
        return left


def _mark(marks: OrderedDict[str, None], session: str) -> None:
    """Mark ``session`` (the oldest mark forgotten past ``MAX_BROKEN``)."""
    marks[session] = None
    if len(marks) > MAX_BROKEN:
        marks.popitem(last=False)
