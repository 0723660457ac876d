"""The shadow's bounded queue, and the rule for a session whose row was dropped.

Two sides use it. In the server, ``admit`` decides per live batch which rows go to the
candidate's process (a lock and a loop over the rows): rows waiting for the candidate
(handed over, not yet taken into a candidate batch) are at most ``capacity``; past that,
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
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass

from rlserve.service.shadow.rows import ShadowRow

MAX_BROKEN = 100_000


@dataclass
class QueueCounts:
    offered: int = 0  # rows that reached ``offer`` or ``admit``
    dropped: int = 0  # rows dropped because the queue was full (or the hand-over refused them)
    skipped: int = 0  # later rows of a session broken by a drop, skipped until its next episode


class ShadowQueue:
    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"a shadow queue holds at least 1 row, not {capacity}")
        self.capacity = capacity
        self.counts = QueueCounts()
        self.admitted = 0  # rows ``admit`` let through, less those ``lost``
        self._rows: deque[ShadowRow] = deque()
        self._lock = threading.Lock()
        self._broken: OrderedDict[str, None] = OrderedDict()
        self.closed = False

    def __len__(self) -> int:
        return len(self._rows)

    def offer(self, rows: list[ShadowRow]) -> None:
        """Queue ``rows`` (in order), dropping what does not fit and skipping broken sessions."""
        with self._lock:
            self._rows.extend(self._admit(rows, len(self._rows)))

    def admit(self, rows: list[ShadowRow], taken: int) -> list[ShadowRow]:
        """The ``rows`` to hand over, in order, when the other side took ``taken`` of those
        admitted so far: what does not fit is dropped, broken sessions skipped."""
        with self._lock:
            kept = self._admit(rows, self.admitted - taken)
            self.admitted += len(kept)
        return kept

    def lost(self, rows: list[ShadowRow]) -> None:
        """``rows`` admitted but never handed over: dropped, their sessions broken."""
        with self._lock:
            self.admitted -= len(rows)
            for row in rows:
                self._drop(row)

    def _admit(self, rows: list[ShadowRow], held: int) -> list[ShadowRow]:
        counts, broken, capacity = self.counts, self._broken, self.capacity
        counts.offered += len(rows)
        if self.closed:
            counts.dropped += len(rows)
            return []
        kept: list[ShadowRow] = []
        for row in rows:
            session = row.session_id
            if session is not None and broken:
                if row.reset:
                    broken.pop(session, None)
                elif session in broken:
                    counts.skipped += 1
                    continue
            if held + len(kept) >= capacity:
                self._drop(row)
                continue
            kept.append(row)
        return kept

    def _drop(self, row: ShadowRow) -> None:
        self.counts.dropped += 1
        session = row.session_id
        if session is not None and not row.end:  # an episode's last row breaks nothing after it
            self._broken[session] = None
            if len(self._broken) > MAX_BROKEN:
                self._broken.popitem(last=False)

    def take(self, limit: int) -> list[ShadowRow]:
        """Up to ``limit`` rows, oldest first, with no session twice (a session's next row
        needs the state its previous one leaves): the batch ends before a repeated session."""
        taken: list[ShadowRow] = []
        seen: set[str] = set()
        with self._lock:
            queue = self._rows
            while queue and len(taken) < limit:
                session = queue[0].session_id
                if session is not None:
                    if session in seen:
                        break
                    seen.add(session)
                taken.append(queue.popleft())
        return taken

    def close(self) -> int:
        """Refuse further rows; how many queued rows were let go (counted as dropped)."""
        with self._lock:
            self.closed = True
            left = len(self._rows)
            self._rows.clear()
            self.counts.dropped += left
        return left
