"""A shadow: a candidate model version run on a live version's traffic, never answering it.

``Shadow`` is what the live ``BatchStep`` feeds (``offer``, after the live answer stands,
beside the experience log's recorder). ``offer`` only keeps the batch (and its sessions'
step counts, which later batches change) and returns: the live batch's answers are written
first. A timer on the event loop (``FLUSH_S`` after the first batch kept) hands everything
kept since the last hand-over over at once (``flush``): the rows as columns, the queue's
admission, one pickle and one ``send`` for many live batches, off every answer's path.
The rows that fit in the bounded queue go to the candidate's own process
(``CandidateProcess``), which runs the candidate on them in batches of its own. Nothing the shadow does or fails
at reaches a live request: a process that fails or dies stops the shadow (its state says
why) and the rows after it are dropped and counted.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from rlserve.service.shadow.process import CandidateProcess
from rlserve.service.shadow.queue import ShadowQueue
from rlserve.service.shadow.rows import batch_rows, session_steps

log = logging.getLogger("rlserve.shadow")

FLUSH_S = 0.01  # the hand-over runs this long after the first live batch it takes
KEEP_ROWS = 4096  # rows kept past which (and past the queue's size) a batch is handed over at once


class Shadow:
    def __init__(self, live: str, candidate: str, queue: ShadowQueue, process: CandidateProcess, *,
                 state_store: str):
        self.live = live  # "<model>@<version>" shadowed
        self.candidate = candidate  # "<model>@<version>" running
        self.queue = queue
        self.process = process
        self.state_store = state_store  # where the candidate's per-session state lives
        self.stopped: str | None = None  # why it stopped (None: running)
        # What ``offer`` kept for the next hand-over: (steps, results, session step counts).
        self._pending: list[tuple[list[Any], list[Any], list[Any]]] = []
        self._pending_rows = 0
        self._armed = False  # a hand-over is scheduled
        self._since = 0.0  # when the oldest kept batch's answers stood
        self._lock = threading.Lock()  # ``offer`` may run in the batcher's thread
        self._handing = threading.Lock()  # one hand-over at a time: a session's rows stay in order
        self._loop: asyncio.AbstractEventLoop | None = None

    def offer(self, steps: list[Any], results: list[Any]) -> None:
        """The live batch's ``steps`` whose answers stand (each with its ``StepOutput``): kept
        for the next hand-over, which the first batch kept schedules on the event loop (from
        the batcher's thread too). Without an event loop, or with more rows kept than both
        ``queue_rows`` and ``KEEP_ROWS`` (the timer is late), they are handed over now; once
        the shadow stopped they are dropped (counted) now."""
        if not steps:
            return
        if self.stopped is not None:  # nothing to hand over: dropped now, so its counts are current
            self.queue.refuse(sum(step.rows for step in steps))
            return
        counts = session_steps(steps)
        with self._lock:
            self._pending.append((steps, results, counts))
            self._pending_rows += sum(step.rows for step in steps)
            armed, self._armed = self._armed, True
            if not armed:
                self._since = time.time()
        if armed and self._pending_rows < max(self.queue.capacity, KEEP_ROWS):
            return
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if armed:  # the timer is late: a bound on what waits for it
            self.flush()
        elif loop is not None:
            self._loop = loop
            loop.call_later(FLUSH_S, self.flush)
        elif self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._loop.call_later, FLUSH_S, self.flush)
        else:
            self.flush()

    def flush(self) -> None:
        """Hand over what ``offer`` kept: one ``RowBatch`` for all of it, the rows that fit."""
        with self._handing:
            with self._lock:
                pending, self._pending, self._pending_rows, self._armed = self._pending, [], 0, False
                now = self._since
            if pending:
                try:
                    self._hand_over(pending, now)
                except Exception:  # the shadow's bug never reaches a live request
                    log.exception("shadow: %s on %s: a hand-over failed", self.candidate, self.live)

    def _hand_over(self, pending: list[tuple[list[Any], list[Any], list[Any]]], now: float) -> None:
        steps = [step for part in pending for step in part[0]]
        results = [result for part in pending for result in part[1]]
        counts = [count for part in pending for count in part[2]]
        batch = self.queue.admit(batch_rows(steps, results, counts, now), self.process.counters["taken"])
        unsent = None if batch is None else self.process.send(batch)
        if unsent is not None:
            self.queue.lost(unsent)

    def stop(self, reason: str, wait: bool = False) -> None:
        """Stop taking rows and stop the candidate's process (``wait``: until it wrote its log
        and exited); what it did not take is dropped (counted)."""
        if self.stopped is None:
            self.stopped = reason
            self.queue.close()
            self.flush()  # what was kept is dropped (counted) by the closed queue
            self.process.stop(wait)

    def _check(self) -> None:
        """Notice a candidate process that exited on its own (a failure, or killed)."""
        if self.stopped is None and (code := self.process.exited()) is not None:
            why = self.process.failure or f"exit status {code}"
            self.stop(f"candidate process failed: {why}")
            log.error("shadow: %s on %s stopped: its process failed (%s)", self.candidate, self.live, why)

    def depth(self) -> int:
        """Rows handed over that the candidate's process has not taken yet (0 once stopped)."""
        self._check()
        if self.stopped is not None:
            return 0
        return self._pending_rows + max(0, self.queue.admitted - self.process.counters["taken"])

    def counts(self) -> dict[str, int]:
        self._check()
        counters, queue = self.process.counters, self.queue.counts
        lost = max(0, self.queue.admitted - counters["taken"]) if self.stopped is not None else 0
        return {"scored": counters["scored"], "dropped": queue.dropped + lost,
                "skipped_broken": queue.skipped + counters["unknown"], "skipped_not_admitted": queue.not_admitted,
                "failed": counters["failed"],
                "unwritten": counters["unwritten"], "store_failures": counters["store_failures"]}

    def state(self) -> str:
        """``starting`` (its process loads the candidate; rows wait or are dropped), ``running``
        or ``stopped``."""
        if self.stopped is not None:
            return "stopped"
        return "running" if self.process.counters["ready"] else "starting"

    def describe(self) -> dict[str, Any]:
        model, _, version = self.live.rpartition("@")
        cand_model, _, cand_version = self.candidate.rpartition("@")
        counts, depth = self.counts(), self.depth()
        return {"live": {"model": model, "version": version},
                "candidate": {"model": cand_model, "version": cand_version},
                "queue_rows": self.queue.capacity, "admit_below_rows": self.queue.admit_below, "queue_depth": depth,
                "state": self.state(), "stopped_because": self.stopped,
                "shadow_sessions": self.process.counters["sessions"], "counts": counts,
                "state_store": self.state_store, "process_id": self.process.pid}
