"""A shadow: a candidate model version run on a live version's traffic, never answering it.

``Shadow`` is what the live ``BatchStep`` feeds (``offer``, after the live answer stands,
beside the experience log's recorder): the batch's rows that fit in the bounded queue are
handed to the candidate's own process (``CandidateProcess``) and the call returns; that
process runs the candidate on them in batches of its own. Nothing the shadow does or fails
at reaches a live request: a process that fails or dies stops the shadow (its state says
why) and the rows after it are dropped and counted.
"""

from __future__ import annotations

import logging
from typing import Any

from rlserve.service.shadow.process import CandidateProcess
from rlserve.service.shadow.queue import ShadowQueue
from rlserve.service.shadow.rows import batch_rows

log = logging.getLogger("rlserve.shadow")


class Shadow:
    def __init__(self, live: str, candidate: str, queue: ShadowQueue, process: CandidateProcess, *,
                 state_store: str):
        self.live = live  # "<model>@<version>" shadowed
        self.candidate = candidate  # "<model>@<version>" running
        self.queue = queue
        self.process = process
        self.state_store = state_store  # where the candidate's per-session state lives
        self.stopped: str | None = None  # why it stopped (None: running)
        self._lost = 0  # rows handed over that the process never took (it stopped first)

    def offer(self, steps: list[Any], results: list[Any]) -> None:
        """The live batch's ``steps`` whose answers stand (each with its ``StepOutput``)."""
        batch = self.queue.admit(batch_rows(steps, results), self.process.counters["taken"])
        unsent = None if batch is None else self.process.send(batch)
        if unsent is not None:
            self.queue.lost(unsent)

    def stop(self, reason: str, wait: bool = False) -> None:
        """Stop taking rows and stop the candidate's process (``wait``: until it wrote its log
        and exited); what it did not take is dropped (counted)."""
        if self.stopped is None:
            self.stopped = reason
            self.queue.close()
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
        return 0 if self.stopped is not None else max(0, self.queue.admitted - self.process.counters["taken"])

    def counts(self) -> dict[str, int]:
        self._check()
        counters, queue = self.process.counters, self.queue.counts
        lost = max(0, self.queue.admitted - counters["taken"]) if self.stopped is not None else 0
        return {"scored": counters["scored"], "dropped": queue.dropped + lost,
                "skipped_broken": queue.skipped + counters["unknown"], "failed": counters["failed"],
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
                "queue_rows": self.queue.capacity, "queue_depth": depth,
                "state": self.state(), "stopped_because": self.stopped,
                "shadow_sessions": self.process.counters["sessions"], "counts": counts,
                "state_store": self.state_store, "process_id": self.process.pid}
