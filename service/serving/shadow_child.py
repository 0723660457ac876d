"""The candidate's process: ``python -m rlserve.service.serving.shadow_child SOCKET_FD COUNTERS_FD``.

Started by the server for each shadow (``rlserve.service.shadow.process``), never by hand.
It reads its ``ChildConfig`` (the first message), loads the candidate's bundle itself
(ONNX Runtime or TorchScript, as the server would), lowers its priority (``lower_priority``:
every thread of it to ``SCHED_IDLE`` where the system has it, and nice 19; a start at that
priority on a busy machine took longer than 30 s), and then runs the candidate on the rows
the server hands over (``ShadowRunner``), in batches of up to ``MAX_ROWS`` rows with no
session twice, one batch after the other while rows wait. It keeps the candidate's per-session state
(and writes it to the session store when the server has one), writes the scores of logged
steps to the experience log's ``shadow/`` table with a writer of its own, and publishes its
counts after each batch.

It exits when the server's end of the socket closes (after running what it received and
writing its log: a server killed by any signal leaves no process behind), or on SIGTERM
(after the batch it is running). SIGINT is the server's to handle. A candidate that cannot
be loaded is logged and said back to the server before the process exits with status 1.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlserve.models.export.bundle import load_bundle
from rlserve.service.experience import files
from rlserve.service.experience.records import ModelLog
from rlserve.service.experience.writer import ExperienceWriter
from rlserve.service.serving.loading import build_policy
from rlserve.service.settings import Settings
from rlserve.service.shadow.durable import DurableShadowState
from rlserve.service.shadow.process import MAX_MESSAGE, SEND_BUFFER, Counters, lower_priority
from rlserve.service.shadow.queue import ShadowQueue
from rlserve.service.shadow.rows import RowBatch
from rlserve.service.shadow.runner import MAX_ROWS, ShadowRunner

log = logging.getLogger("rlserve.shadow")

POLL_S = 0.05  # how long it waits for rows when it holds none
GATHER_S = 0.02  # after a batch that left no row waiting: rows gather meanwhile, so batches grow
RECEIVE_BYTES = 2 * SEND_BUFFER  # the largest message it reads (the kernel doubles the buffer asked for)


@dataclass
class ChildConfig:
    bundle: Path  # the candidate's bundle directory (loaded by the server too)
    label: str  # "<model>@<version>" of the candidate
    live: str  # "<model>@<version>" shadowed
    settings: Settings
    model_log: ModelLog | None  # the live model's part of the experience log (None: not logged)
    durable: str | None  # the namespace of its state in the session store (None: none)


def main(argv: list[str]) -> int:
    channel = socket.socket(fileno=int(argv[0]))
    counters = Counters(int(argv[1]))
    stopping: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s %(name)s [shadow process {os.getpid()}]: %(message)s")
    config: ChildConfig = pickle.loads(channel.recv(RECEIVE_BYTES))
    try:
        runner, writer = _build(config)
    except Exception as exc:
        log.exception("shadow %s on %s: the candidate cannot be run", config.label, config.live)
        try:
            channel.send(f"{type(exc).__name__}: {exc}".encode()[:MAX_MESSAGE])
        except OSError:  # the server is gone already
            pass
        return 1
    policy = lower_priority()
    counters.set(ready=1)
    log.info("shadow %s on %s: running (pid %d, %s, nice %d)", config.label, config.live, os.getpid(), policy,
             os.getpriority(os.PRIO_PROCESS, 0))
    try:
        _serve(channel, runner, counters, stopping, writer)
    finally:
        runner.close()
        if writer is not None:
            writer.close()
    return 0


def _build(config: ChildConfig) -> tuple[ShadowRunner, ExperienceWriter | None]:
    settings = config.settings.model_copy(update={"verify_on_load": False, "intra_op_threads": 1,
                                                  "intra_op_spinning": False})
    candidate = build_policy(load_bundle(config.bundle), settings, shown=config.label).step
    durable = None
    if config.durable is not None and settings.session_store is not None:
        durable = DurableShadowState(settings.session_store, config.durable, ttl_s=settings.session_idle_ttl_s,
                                     timeout_s=settings.session_store_timeout_s)
    writer = sink = None
    model = config.model_log
    if model is not None and settings.experience_log is not None:
        files.load_parquet()  # now, not at its first write (the server's stop may be waiting for that)
        writer = ExperienceWriter(settings.experience_log, queue_rows=settings.experience_queue_rows,
                                  roll_s=settings.experience_roll_s, roll_bytes=settings.experience_roll_bytes,
                                  flush_s=settings.experience_flush_s)
        sink = _sink(writer, model)
    runner = ShadowRunner(candidate, config.label, max_sessions=settings.max_sessions,
                          idle_ttl_s=settings.session_idle_ttl_s, sink=sink, durable=durable)
    return runner, writer


def _sink(writer: ExperienceWriter, model: ModelLog) -> Any:
    return lambda scores: writer.offer_shadow(model, scores)


def _serve(channel: socket.socket, runner: ShadowRunner, counters: Counters, stopping: list[bool],
           writer: ExperienceWriter | None) -> None:
    queue = ShadowQueue(sys.maxsize)  # the server bounds what it hands over
    buffer = memoryview(bytearray(RECEIVE_BYTES))
    channel.setblocking(False)
    open_ = True
    while not stopping:
        if open_:
            open_ = _receive(channel, queue, buffer, 0.0 if len(queue) else POLL_S)
        rows = queue.take(MAX_ROWS)
        if rows:
            runner.run(rows)
            counts = runner.counts
            failed_writes = 0 if writer is None else writer.dropped.get("write_failed", 0)
            counters.set(scored=counts.scored, unknown=counts.unknown, failed=counts.failed,
                         unwritten=counts.unwritten + failed_writes, sessions=len(runner.store),
                         store_failures=0 if runner.durable is None else runner.durable.failures)
            counters.set(taken=counts.taken)  # last: the server reads a taken row's outcome as counted
        elif not open_:
            return
        if open_ and not len(queue):  # nothing waits: rows gather meanwhile, so batches grow
            time.sleep(GATHER_S)


def _receive(channel: socket.socket, queue: ShadowQueue, buffer: memoryview, wait_s: float) -> bool:
    """Queue every message waiting (waiting up to ``wait_s`` for one); False once the server's end closed."""
    if wait_s > 0:
        select.select([channel], [], [], wait_s)
    while True:
        try:
            size = channel.recv_into(buffer)
        except BlockingIOError:
            return True
        except OSError:  # the server's end reset
            return False
        if size == 0:
            return False
        queue.offer(RowBatch.from_wire(pickle.loads(buffer[:size])).rows())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
