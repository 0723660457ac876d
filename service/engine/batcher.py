"""Dynamic batching: many concurrent requests for one model version -> one runtime call.

Requests queue as ``Job``s. One worker task per batcher waits for the first job, then
gathers more until the batch holds ``max_rows`` rows or ``max_delay_s`` has passed since
that first job arrived. With no delay it takes what is queued after one more turn of the
event loop, so requests parsed in the same turn share a batch; a lone client (the previous
batch held one request and the worker sat idle) skips that turn. Two jobs touching the same
session never share a batch: the later one waits for the next, so one session's steps
apply in arrival order.

A batch runs inline when small (a thread hop costs more than a small model) and in a
worker thread when large, so the event loop keeps parsing requests meanwhile. If the
batch function raises, only that batch's jobs fail; the worker keeps going.

Two optional hooks run on the event loop around a batch (an external session store's
read and write, ``rlserve.service.step.batch.BatchStep.before_batch``/``after_batch``):
``before(payloads)`` may refuse single jobs before the batch runs, ``after(payloads,
results)`` may replace results (e.g. with a 409) before any job is answered.

A job is awaited (``submit``) or carries a completion callback (``submit_nowait``): the
callback runs on the event loop inside the batch's own loop over its jobs, so a caller
without a task per request (``rlserve.service.act.protocol``) pays no wake-up per request.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rlserve.service.errors import BatchFailed, NotReady, QueueFull, ServiceError, as_service_error

log = logging.getLogger("rlserve.batcher")

_batch_ids = itertools.count(1)  # unique across the process, so tests can compare them


@dataclass(eq=False, slots=True)
class Job:
    """One request's work: ``payload`` is what the batch function receives."""

    payload: Any
    rows: int
    keys: frozenset[str] = frozenset()  # session ids; jobs sharing one never share a batch
    enqueued: float = field(default_factory=time.perf_counter)
    queue_s: float = 0.0  # set when its batch starts
    future: asyncio.Future | None = None
    done: DoneFn | None = None  # instead of a future (``submit_nowait``)


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """Debug metadata of the batch a job ran in (each job's wait is ``Job.queue_s``)."""

    batch_id: int
    rows: int
    requests: int
    run_s: float


BatchFn = Callable[[list[Any]], Sequence[Any]]  # gets the batch's payloads as a list
# done(result, info, error): exactly one of (result, info) and error is set.
DoneFn = Callable[[Any, BatchInfo | None, ServiceError | None], None]
Observer = Callable[[BatchInfo, Sequence[Job]], None]
# before(payloads) -> per payload None (run it) or the error that refuses it
BeforeFn = Callable[[list[Any]], Awaitable[Sequence[ServiceError | None]]]
# run(payloads, rows) -> results: payloads run as a batch is (inline or in the batcher's
# thread by size; a failure becomes each payload's BatchFailed)
RunFn = Callable[[list[Any], int], Awaitable[list[Any]]]
# after(payloads, results, run) -> results, one per payload (a ServiceError fails its own
# job); ``run`` runs some payloads again
AfterFn = Callable[[list[Any], list[Any], RunFn], Awaitable[Sequence[Any]]]


class Batcher:
    """Per-model queue plus worker. ``run_batch(payloads) -> results`` (one per payload;
    a result that is a ``ServiceError`` instance fails only its own job)."""

    def __init__(
        self,
        run_batch: BatchFn,
        *,
        max_rows: int,
        max_delay_s: float,
        queue_limit: int,
        inline_rows: int,
        enabled: bool = True,
        retry_after_s: int = 1,
        observer: Observer | None = None,
        name: str = "",
        before: BeforeFn | None = None,
        after: AfterFn | None = None,
    ):
        self._run_batch = run_batch
        self._before = before
        self._after = after
        self.max_rows = max_rows
        self.max_delay_s = max_delay_s
        self.queue_limit = queue_limit
        self.inline_rows = inline_rows
        self.enabled = enabled
        self.retry_after_s = retry_after_s
        self._observer = observer
        self.name = name
        self._queue: deque[Job] = deque()
        self._rows_queued = 0
        self._waiter: asyncio.Future | None = None
        self._need_rows = 1  # rows that wake the worker (1 while idle, max_rows while filling)
        self._worker: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False
        self._last_jobs = 0  # requests in the last batch

    @property
    def queued_rows(self) -> int:
        return self._rows_queued

    # ------------------------------------------------------------------ client side

    def check_capacity(self, rows: int) -> None:
        """Raise 503 now if ``rows`` more rows would overflow the queue (or it is closed)."""
        if self._closed:
            raise NotReady(f"model {self.name} is being unloaded")
        # A lone request larger than the limit still runs: it is one runtime call anyway.
        if self._rows_queued + rows > self.queue_limit and self._rows_queued:
            raise QueueFull(
                f"model {self.name}: {self._rows_queued} rows queued (limit {self.queue_limit}); retry later",
                headers={"Retry-After": str(self.retry_after_s)},
            )

    async def submit(self, job: Job) -> tuple[Any, BatchInfo]:
        """Queue ``job`` and wait for (result, batch info); raises its ``ServiceError``."""
        loop = asyncio.get_running_loop()
        job.future = loop.create_future()
        self._enqueue(job, loop)
        return await job.future

    def submit_nowait(self, job: Job, done: DoneFn) -> None:
        """Queue ``job``; ``done(result, info, error)`` runs on the event loop when its
        batch finished (or failed). Raises 503 at once, like ``submit``, when full.
        Must be called from the event loop's thread."""
        job.done = done
        self._enqueue(job, asyncio.get_running_loop())

    def _enqueue(self, job: Job, loop: asyncio.AbstractEventLoop) -> None:
        if self._closed or self._rows_queued + job.rows > self.queue_limit:
            self.check_capacity(job.rows)
        worker = self._worker
        if worker is None or self._loop is not loop or worker.done():
            self._ensure_worker(loop)
        self._queue.append(job)
        self._rows_queued += job.rows
        waiter = self._waiter
        if waiter is not None and not waiter.done() and self._rows_queued >= self._need_rows:
            waiter.set_result(None)

    def _ensure_worker(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._worker is None or self._worker.done() or self._loop is not loop:
            self._loop = loop
            self._worker = loop.create_task(self._work(), name=f"batcher:{self.name}")

    async def close(self) -> None:
        """Stop the worker; queued jobs fail with 503."""
        self._closed = True
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except (asyncio.CancelledError, Exception):
                pass
        while self._queue:
            self._fail(self._queue.popleft(), NotReady(f"model {self.name} was unloaded"))
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    # ------------------------------------------------------------------ worker side

    async def _work(self) -> None:
        while True:
            idle = await self._wait_for(1, None)
            # Without a batching window, one more loop turn lets requests that arrive just
            # after the first join its batch. A lone client (the last batch held one
            # request, and the worker was idle until this one) gains nothing from it, so
            # its batch runs at once; as soon as batches hold several requests the extra
            # turn is back, keeping batches whole under concurrent load.
            if self.enabled and (self.max_delay_s > 0 or not idle or self._last_jobs > 1):
                await self._fill()
            batch = self._take()
            if not batch:
                continue
            try:
                await self._execute(batch)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must not strand the queue behind a dead worker
                log.exception("batcher %s: unexpected error; failing the batch", self.name)
                for job in batch:
                    self._fail(job, BatchFailed(f"model {self.name}: internal error while batching"))

    async def _wait_for(self, rows: int, timeout: float | None) -> bool:
        """Sleep until ``rows`` rows are queued or ``timeout`` seconds pass; False if there
        already were, without sleeping."""
        if self._rows_queued >= rows:
            return False
        loop = asyncio.get_running_loop()
        self._need_rows = rows
        self._waiter = waiter = loop.create_future()
        timer = loop.call_later(timeout, _wake, waiter) if timeout is not None else None
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
        return True

    async def _fill(self) -> None:
        if self.max_delay_s <= 0:
            await asyncio.sleep(0)  # let requests parsed in this loop turn join
            return
        remaining = self._queue[0].enqueued + self.max_delay_s - time.perf_counter()
        if remaining > 0:
            await self._wait_for(self.max_rows, remaining)

    def _take(self) -> list[Job]:
        """Up to ``max_rows`` rows in arrival order, skipping jobs whose session is taken."""
        batch: list[Job] = []
        deferred: list[Job] = []
        taken: set[str] = set()
        rows = 0
        limit = self.max_rows if self.enabled else 1
        while self._queue:
            job = self._queue[0]
            if batch and (rows + job.rows > self.max_rows or len(batch) >= limit):
                break
            self._queue.popleft()
            if job.keys and not taken.isdisjoint(job.keys):
                deferred.append(job)
                continue
            taken |= job.keys
            batch.append(job)
            rows += job.rows
        self._queue.extendleft(reversed(deferred))
        self._rows_queued -= rows
        return batch

    async def _execute(self, batch: list[Job]) -> None:
        started = time.perf_counter()
        try:
            if self._before is not None:
                batch = await self._screen(batch)
                if not batch:
                    return
            payloads: list[Any] = []
            rows = 0
            for job in batch:
                job.queue_s = started - job.enqueued
                payloads.append(job.payload)
                rows += job.rows
            results = await self._run(payloads, rows)
            if self._after is not None:
                results = await self._finish(payloads, results)
        except asyncio.CancelledError:
            for job in batch:
                self._fail(job, NotReady(f"model {self.name} was unloaded"))
            raise
        info = BatchInfo(next(_batch_ids), rows, len(batch), time.perf_counter() - started)
        self._last_jobs = len(batch)
        for job, result in zip(batch, results, strict=True):
            if isinstance(result, ServiceError):
                self._fail(job, result)
            elif job.done is not None:
                _call(job, result, info, None)
            elif job.future is not None and not job.future.done():
                job.future.set_result((result, info))
        if self._observer is not None:
            try:
                self._observer(info, batch)
            except Exception:  # metrics must never fail a request
                log.exception("batch observer failed")

    async def _run(self, payloads: list[Any], rows: int) -> list[Any]:
        """The batch function on ``payloads``: inline when small, else in the batcher's thread.
        If it raises, every payload gets the failure (a poisoned batch fails only itself)."""
        try:
            if rows > self.inline_rows:
                return list(await asyncio.get_running_loop().run_in_executor(self._thread(), self._run_batch,
                                                                             payloads))
            return list(self._run_batch(payloads))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("batch of %d requests for %s failed", len(payloads), self.name)
            error = BatchFailed(f"model {self.name}: the runtime failed on this batch: {type(exc).__name__}: {exc}")
            return [error] * len(payloads)

    async def _screen(self, batch: list[Job]) -> list[Job]:
        """The jobs ``before`` lets run; the others are answered with its refusal."""
        assert self._before is not None
        try:
            refusals = await self._before([job.payload for job in batch])
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = as_service_error(exc, log, f"batcher {self.name}: the before-batch hook failed")
            refusals = [error] * len(batch)
        kept = []
        for job, refusal in zip(batch, refusals, strict=True):
            if refusal is None:
                kept.append(job)
            else:
                self._fail(job, refusal)
        return kept

    async def _finish(self, payloads: list[Any], results: list[Any]) -> list[Any]:
        assert self._after is not None
        try:
            return list(await self._after(payloads, results, self._run))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = as_service_error(exc, log, f"batcher {self.name}: the after-batch hook failed")
            return [error] * len(results)

    def _thread(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"batch-{self.name}")
        return self._executor

    @staticmethod
    def _fail(job: Job, error: ServiceError) -> None:
        if job.done is not None:
            _call(job, None, None, error)
        elif job.future is not None and not job.future.done():
            job.future.set_exception(error)


def _call(job: Job, result: Any, info: BatchInfo | None, error: ServiceError | None) -> None:
    """One job's callback, called once; its failure is logged and never reaches the batch's
    other jobs. The job lets go of it first: the callback usually holds the job, and that
    cycle would otherwise wait for the garbage collector."""
    done, job.done = job.done, None
    if done is None:
        return
    try:
        done(result, info, error)
    except Exception:
        log.exception("a batch job's completion callback failed")


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)
