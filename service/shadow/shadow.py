"""A shadow: a candidate model version run on a live version's traffic, never answering it.

``Shadow`` is what the live ``BatchStep`` feeds (``offer``, after the live answer stands,
beside the experience log's recorder): the batch's rows go into a bounded queue and the
call returns; the ``ShadowRunner``'s thread runs the candidate on them in batches of its
own. Nothing the shadow does or fails at reaches a live request.
"""

from __future__ import annotations

from typing import Any

from rlserve.service.shadow.queue import ShadowQueue
from rlserve.service.shadow.rows import shadow_rows
from rlserve.service.shadow.runner import ShadowRunner


class Shadow:
    def __init__(self, live: str, candidate: str, runner: ShadowRunner):
        self.live = live  # "<model>@<version>" shadowed
        self.candidate = candidate  # "<model>@<version>" running
        self.runner = runner
        self.queue: ShadowQueue = runner.queue
        self.stopped: str | None = None  # why it stopped (None: running)

    def offer(self, steps: list[Any], results: list[Any]) -> None:
        """The live batch's ``steps`` whose answers stand (each with its ``StepOutput``)."""
        self.queue.offer(shadow_rows(steps, results))

    def start(self) -> None:
        self.runner.start()

    def stop(self, reason: str) -> None:
        """Stop taking rows and stop the runner; what was queued is dropped (counted)."""
        if self.stopped is None:
            self.stopped = reason
            self.queue.close()
            self.runner.stop()

    def counts(self) -> dict[str, int]:
        queue, runner = self.queue.counts, self.runner.counts
        return {"scored": runner.scored, "dropped": queue.dropped, "skipped_broken": queue.skipped + runner.unknown,
                "failed": runner.failed, "unwritten": runner.unwritten,
                "store_failures": 0 if self.runner.durable is None else self.runner.durable.failures}

    def describe(self) -> dict[str, Any]:
        model, _, version = self.live.rpartition("@")
        cand_model, _, cand_version = self.candidate.rpartition("@")
        return {"live": {"model": model, "version": version},
                "candidate": {"model": cand_model, "version": cand_version},
                "queue_rows": self.queue.capacity, "queue_depth": len(self.queue),
                "state": "running" if self.stopped is None else "stopped", "stopped_because": self.stopped,
                "shadow_sessions": len(self.runner.store), "counts": self.counts(),
                "state_store": "external" if self.runner.durable is not None else "this process"}
