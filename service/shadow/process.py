"""The candidate's process, seen from both ends: how rows cross over and how counts come back.

The server starts one process per shadow (``CandidateProcess``: ``python -m <module>``,
the module being ``rlserve.service.serving.shadow_child``), so the candidate's Python never
holds the server's interpreter lock: the live loop gives up nothing but the CPU the
process, at the lowest priority, takes when the live loop leaves it.

- **Its priority**, once it loaded the candidate, is the lowest (``lower_priority``): every
  thread of it under ``SCHED_IDLE`` where the system has it (the live server preempts it as
  soon as it wakes; it runs only on CPU time nothing else wants) and at nice 19 (all that is
  left where ``SCHED_IDLE`` is not). A stop gives it back an ordinary policy at nice 19
  (``SCHED_OTHER``, allowed without privilege), so that on a busy machine it gets a share
  to finish its batch and write its log before ``STOP_S``.
- **Rows** cross a ``SOCK_SEQPACKET`` Unix socket pair: one message per live batch, its
  ``RowBatch`` (columns) pickled. The
  server's end never blocks: a message the socket has no room for is refused and its rows
  are dropped and counted (``ShadowQueue.lost``). The first message is the process's
  configuration; the only message back is why it failed, sent before it exits.
- **Counts** come back through shared memory (``Counters``: an anonymous memory file both
  map, one int64 per count, written by the candidate's process after each batch and read
  by the server whenever asked): no message, no thread, no lock on the server's side.
- **Its life** follows the server's: when the server's end closes (a stop, or the server
  killed by any signal) the process runs what it already received, writes its log, and
  exits; ``stop`` also sends SIGTERM, after which it runs no further batch.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

import numpy as np

from rlserve.service.shadow.rows import RowBatch

log = logging.getLogger("rlserve.shadow")

COUNTS = ("ready", "taken", "scored", "unknown", "failed", "unwritten", "store_failures", "sessions")
# The candidate's process priority once it loaded the candidate: it runs on what the live
# loop leaves. It starts (imports, loads) at the server's: at nice 19 on a busy machine a
# start took longer than 30 s (measured), every row meanwhile dropped.
NICE = 19
SEND_BUFFER = 4 << 20  # bytes of rows the socket may hold (asked; the kernel may give less)
MAX_MESSAGE = 1 << 16  # the largest message back (why the process failed)
STOP_S = 30.0  # how long a stopping process may take to finish its batch and write its log


def lower_priority(pid: int = 0) -> str:
    """Every thread of process ``pid`` (0: this one) to the lowest priority: ``SCHED_IDLE``
    where the system has it, and nice ``NICE`` (nice is per thread on Linux). The policy it got."""
    policy = "SCHED_OTHER"
    for thread in _threads(pid):
        try:
            os.setpriority(os.PRIO_PROCESS, thread, NICE)
        except OSError:  # the thread ended meanwhile
            pass
        if hasattr(os, "SCHED_IDLE"):
            try:
                os.sched_setscheduler(thread, os.SCHED_IDLE, os.sched_param(0))
                policy = "SCHED_IDLE"
            except OSError:  # not allowed here (a container's seccomp profile), or the thread ended
                pass
    return policy


def stopping_priority(pid: int) -> None:
    """Process ``pid``'s threads back from ``SCHED_IDLE`` to an ordinary policy at nice ``NICE``."""
    if not hasattr(os, "SCHED_IDLE"):
        return
    for thread in _threads(pid):
        try:
            if os.sched_getscheduler(thread) == os.SCHED_IDLE:
                os.sched_setscheduler(thread, os.SCHED_OTHER, os.sched_param(0))
        except OSError:  # the thread or the process ended, or not allowed
            pass


def _threads(pid: int) -> list[int]:
    """The thread ids of process ``pid`` (0: this one); the process id alone where
    ``/proc`` does not list them."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid or 'self'}/task")]
    except OSError:
        return [pid]


class Counters:
    """The candidate process's counts (``COUNTS``), in memory both processes map."""

    def __init__(self, fd: int | None = None):
        size = 8 * len(COUNTS)
        if fd is None:
            fd = os.memfd_create("rlserve-shadow-counts", 0)  # inheritable only through pass_fds
            os.ftruncate(fd, size)
        self.fd = fd
        self._map = mmap.mmap(fd, size)
        self.values = np.frombuffer(self._map, np.int64)

    def __getitem__(self, name: str) -> int:
        return int(self.values[COUNTS.index(name)])

    def set(self, **counts: int) -> None:
        for name, value in counts.items():
            self.values[COUNTS.index(name)] = value


class CandidateProcess:
    """The server's handle on one candidate process."""

    def __init__(self, module: str, config: Any):
        self.counters = Counters()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", module, str(theirs.fileno()), str(self.counters.fd)],
                pass_fds=(theirs.fileno(), self.counters.fd), stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
            os.close(self.counters.fd)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)  # the kernel caps it (wmem_max)
        ours.sendall(pickle.dumps(config))
        ours.setblocking(False)
        self._socket = ours
        self.failure: str | None = None  # why the process failed, as it said
        self.closed = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, batch: RowBatch) -> RowBatch | None:
        """Hand ``batch`` over; the rows not sent (None: all sent) when the socket has no
        room or is closed."""
        sent = self._send(batch)
        return None if sent == len(batch) else batch.take(list(range(sent, len(batch))))

    def _send(self, batch: RowBatch) -> int:
        """How many of ``batch``'s first rows were sent; a message too large for the socket
        is sent in halves."""
        try:
            self._socket.send(pickle.dumps(batch.wire(), protocol=5))
            return len(batch)
        except OSError as exc:  # full (EAGAIN), too large (EMSGSIZE), or the process is gone (EPIPE)
            if exc.errno != errno.EMSGSIZE or len(batch) < 2:
                return 0
        half = len(batch) // 2
        sent = self._send(batch.take(list(range(half))))
        return sent if sent < half else half + self._send(batch.take(list(range(half, len(batch)))))

    def exited(self) -> int | None:
        """The process's exit status once it exited (reading why, if it said)."""
        code = self.proc.poll()
        if code is not None and self.failure is None and not self.closed:
            try:
                self.failure = self._socket.recv(MAX_MESSAGE).decode(errors="replace") or None
            except OSError:
                pass
        return code

    def stop(self, wait: bool = False) -> None:
        """Close the server's end and ask the process to stop; it is waited for (``wait``:
        here; else by a thread, the caller being the event loop), killed after ``STOP_S``."""
        if self.closed:
            return
        self.closed = True
        self._socket.close()
        if self.proc.poll() is None:
            stopping_priority(self.proc.pid)
            try:
                self.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        if wait:
            self._reap()
        else:
            threading.Thread(target=self._reap, name=f"shadow-reap-{self.pid}", daemon=True).start()

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def _reap(self) -> None:
        if self.wait(STOP_S) is None:
            log.warning("shadow: candidate process %d did not stop in %.0f s; killed", self.pid, STOP_S)
            self.proc.kill()
            self.proc.wait()
