"""The batcher: size/delay limits, one batch for concurrent requests, per-session order,
failure isolation and the queue limit."""

from __future__ import annotations

import asyncio

import pytest

from rlserve.service.engine.batcher import Batcher, Job
from rlserve.service.errors import BatchFailed, InvalidInput, QueueFull

pytestmark = pytest.mark.asyncio


class Recorder:
    """A batch function that records each batch's payloads and echoes them back."""

    def __init__(self, fail_on=None):
        self.batches: list[list] = []
        self.fail_on = fail_on

    def __call__(self, payloads):
        self.batches.append(list(payloads))
        if self.fail_on is not None and self.fail_on in payloads:
            raise RuntimeError("poisoned batch")
        return [p * 10 if isinstance(p, int) else p for p in payloads]


def _batcher(fn, **kw) -> Batcher:
    args = {"max_rows": 8, "max_delay_s": 0.0, "queue_limit": 100, "inline_rows": 64}
    args.update(kw)
    return Batcher(fn, name="test", **args)


async def test_concurrent_jobs_share_one_batch():
    rec = Recorder()
    b = _batcher(rec, max_rows=4, max_delay_s=5.0)  # closes on size, long before the delay
    results = await asyncio.gather(*(b.submit(Job(i, 1)) for i in range(4)))
    assert [r for r, _ in results] == [0, 10, 20, 30]
    assert len({info.batch_id for _, info in results}) == 1
    assert results[0][1].rows == 4 and results[0][1].requests == 4
    assert rec.batches == [[0, 1, 2, 3]]
    await b.close()


async def test_delay_closes_a_partial_batch():
    rec = Recorder()
    b = _batcher(rec, max_rows=100, max_delay_s=0.02)
    results = await asyncio.gather(*(b.submit(Job(i, 1)) for i in range(3)))
    assert [r for r, _ in results] == [0, 10, 20]
    assert rec.batches == [[0, 1, 2]]
    await b.close()


async def test_max_rows_splits_batches():
    rec = Recorder()
    b = _batcher(rec, max_rows=3, max_delay_s=0.05)
    await asyncio.gather(*(b.submit(Job(i, 1)) for i in range(7)))
    assert [len(x) for x in rec.batches] == [3, 3, 1]
    await b.close()


async def test_jobs_of_one_session_never_share_a_batch_and_keep_order():
    rec = Recorder()
    b = _batcher(rec, max_rows=10, max_delay_s=0.05)
    jobs = [Job("a1", 1, frozenset({"a"})), Job("b1", 1, frozenset({"b"})), Job("a2", 1, frozenset({"a"})),
            Job("a3", 1, frozenset({"a"})), Job("c1", 1)]
    await asyncio.gather(*(b.submit(j) for j in jobs))
    assert rec.batches == [["a1", "b1", "c1"], ["a2"], ["a3"]]
    await b.close()


async def test_failing_batch_fails_only_its_jobs_and_worker_survives():
    rec = Recorder(fail_on=13)
    b = _batcher(rec, max_rows=2, max_delay_s=0.05)
    outcomes = await asyncio.gather(*(b.submit(Job(i, 1)) for i in (12, 13, 14, 15)), return_exceptions=True)
    assert isinstance(outcomes[0], BatchFailed) and isinstance(outcomes[1], BatchFailed)
    assert [r for r, _ in outcomes[2:]] == [140, 150]
    assert (await b.submit(Job(1, 1)))[0] == 10
    await b.close()


async def test_per_job_errors_from_the_batch_function():
    b = _batcher(
        lambda payloads: [InvalidInput("bad row") if p < 0 else p for p in payloads], max_rows=2, max_delay_s=0.05
    )
    outcomes = await asyncio.gather(b.submit(Job(-1, 1)), b.submit(Job(2, 1)), return_exceptions=True)
    assert isinstance(outcomes[0], InvalidInput) and outcomes[1][0] == 2
    await b.close()


async def test_queue_limit_answers_503_with_retry_after():
    b = _batcher(lambda payloads: payloads, max_rows=1, queue_limit=3, max_delay_s=0.0, retry_after_s=2)
    tasks = [asyncio.ensure_future(b.submit(Job(i, 1))) for i in range(3)]
    await asyncio.sleep(0)  # the three jobs are queued; the worker has not run yet
    with pytest.raises(QueueFull) as info:
        await b.submit(Job(99, 1))
    assert info.value.status == 503 and info.value.headers["Retry-After"] == "2"
    assert [r for r, _ in await asyncio.gather(*tasks)] == [0, 1, 2]
    await b.close()


async def test_batching_off_runs_one_job_per_call():
    rec = Recorder()
    b = _batcher(rec, enabled=False, max_delay_s=0.05)
    await asyncio.gather(*(b.submit(Job(i, 1)) for i in range(3)))
    assert rec.batches == [[0], [1], [2]]
    await b.close()


async def test_large_batches_run_in_a_worker_thread():
    import threading

    threads = []

    def fn(payloads):
        threads.append(threading.current_thread().name)
        return payloads

    b = _batcher(fn, inline_rows=4, max_rows=100)
    await b.submit(Job(1, 2))
    await b.submit(Job(2, 10))
    assert threads[0] == threading.current_thread().name and threads[1].startswith("batch-")
    await b.close()


async def test_a_broken_observer_does_not_stop_the_worker():
    def observer(info, jobs):
        raise RuntimeError("metrics backend down")

    b = _batcher(lambda payloads: payloads, observer=observer)
    assert (await b.submit(Job(1, 1)))[0] == 1
    assert (await b.submit(Job(2, 1)))[0] == 2
    await b.close()


async def test_submit_nowait_calls_back_from_the_batch_and_fails_only_its_own_jobs():
    rec = Recorder(fail_on=13)
    b = _batcher(rec, max_rows=2, max_delay_s=5.0)
    seen: list[tuple] = []
    done = asyncio.Event()

    def callback(tag):
        def on_done(result, info, error):
            seen.append((tag, result, None if info is None else info.requests, type(error).__name__ if error else None))
            if len(seen) == 4:
                done.set()
        return on_done

    jobs = [Job(p, 1) for p in (1, 2, 13, 4)]
    for job in jobs:
        b.submit_nowait(job, callback(job.payload))
    await asyncio.wait_for(done.wait(), 5)
    assert sorted(seen) == [(1, 10, 2, None), (2, 20, 2, None), (4, None, None, "BatchFailed"),
                            (13, None, None, "BatchFailed")]
    # Each job let go of its callback once it ran (no job <-> callback cycle left behind).
    assert all(job.done is None for job in jobs)


async def test_a_failing_callback_does_not_reach_the_other_jobs():
    b = _batcher(Recorder(), max_rows=3, max_delay_s=5.0)
    got = []

    def bad(result, info, error):
        raise RuntimeError("the connection is gone")

    b.submit_nowait(Job(1, 1), bad)
    b.submit_nowait(Job(2, 1), lambda r, i, e: got.append(r))
    assert (await b.submit(Job(3, 1)))[0] == 30
    assert got == [20]


async def test_submit_nowait_refuses_at_once_when_the_queue_is_full():
    b = _batcher(Recorder(), queue_limit=2, max_delay_s=5.0, max_rows=8)
    b.submit_nowait(Job(1, 2), lambda r, i, e: None)
    with pytest.raises(QueueFull):
        b.submit_nowait(Job(2, 1), lambda r, i, e: None)
    await b.close()


async def test_without_a_window_requests_of_one_turn_share_a_batch_after_a_lone_client():
    """A lone client's batch runs without the extra loop turn, yet requests that arrive in
    the same loop turn still share one batch, and jobs queued during a batch join the next
    one whole (the extra turn is back once batches hold several requests)."""
    rec = Recorder()
    b = _batcher(rec)
    assert (await b.submit(Job(1, 1)))[0] == 10  # a lone client, twice
    assert (await b.submit(Job(2, 1)))[0] == 20
    results = await asyncio.gather(*(b.submit(Job(i, 1)) for i in range(3, 7)))
    assert [r for r, _ in results] == [30, 40, 50, 60]
    assert rec.batches == [[1], [2], [3, 4, 5, 6]]
    results = await asyncio.gather(*(b.submit(Job(i, 1)) for i in range(7, 10)))
    assert rec.batches[-1] == [7, 8, 9]
    await b.close()
