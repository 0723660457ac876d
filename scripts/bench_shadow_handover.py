"""What handing a live batch's rows to the shadow's process costs the live path (not a test:
it prints numbers).

Per live batch of B rows like the bench LSTM's (16 float observations from JSON, a 2-float
action, a reward, an event id), the server's side of ``Shadow.offer`` after ``batch_rows``
built its ``RowBatch``: ``ShadowQueue.admit`` and ``CandidateProcess.send`` (one pickled
message on the ``SOCK_SEQPACKET`` socket), to a process that reads and discards them. Prints the
median and p99 microseconds per batch and per row, for B = 1, 8, 32 and 128, and what a
send costs when the socket is full (the rows are dropped).

    python scripts/bench_shadow_handover.py [--batches 20000]
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlserve.service.shadow.process import CandidateProcess  # noqa: E402
from rlserve.service.shadow.queue import ShadowQueue  # noqa: E402
from rlserve.service.shadow.rows import RowBatch  # noqa: E402


def rows(batch: int, rng) -> RowBatch:
    """A live batch of ``batch`` session rows (no reported action, no mask)."""
    return RowBatch([f"session-{k}" for k in range(batch)], [False] * batch,
                    [rng.uniform(-1, 1, 16).tolist() for _ in range(batch)],
                    rng.normal(size=(batch, 2)).astype(np.float32), [0.5] * batch, [None] * batch, [None] * batch,
                    [True] * batch, [0] * batch, [f"{k:032x}" for k in range(batch)], [7] * batch, time.time())


def handle(reader: bool) -> CandidateProcess:
    """A ``CandidateProcess`` whose other end is a process that reads and discards (or, with
    ``reader`` false, never reads: a full socket)."""
    handle = CandidateProcess.__new__(CandidateProcess)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    pid = os.fork()
    if pid == 0:  # the reader
        ours.close()
        while reader and theirs.recv(1 << 23):
            pass
        time.sleep(3600 * (not reader))
        os._exit(0)
    theirs.close()
    ours.setblocking(False)
    handle._socket, handle.closed, handle.failure = ours, False, None
    handle.reader_pid = pid  # type: ignore[attr-defined]
    return handle


def measure(process: CandidateProcess, batch: int, count: int, rng) -> np.ndarray:
    queue = ShadowQueue(1 << 40)
    made = rows(batch, rng)
    took = np.empty(count)
    for i in range(count):
        start = time.perf_counter()
        kept = queue.admit(made, 0)
        unsent = None if kept is None else process.send(kept)
        if unsent is not None:
            queue.lost(unsent)
        took[i] = time.perf_counter() - start
        if i % 64 == 63:
            time.sleep(0.0005)  # let the reader keep up (a live loop sends between requests)
    return took * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=20000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"machine: {platform.machine()} cpus={os.cpu_count()} python={platform.python_version()}")
    for reader in (True, False):
        process = handle(reader)
        try:
            for batch in (1, 8, 32, 128):
                took = measure(process, batch, args.batches, rng)
                what = "sent" if reader else "socket full, dropped"
                print(f"B={batch:4d} ({what}): median {np.median(took):7.1f} us per batch "
                      f"({np.median(took) / batch:5.2f} per row), p99 {np.percentile(took, 99):7.1f} us")
        finally:
            os.kill(process.reader_pid, 9)  # type: ignore[attr-defined]
            os.waitpid(process.reader_pid, 0)  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
