"""A benchmarked server's process tree, read from /proc (Linux): its members, their CPU time,
and signals to all of them. bench_server.py's load generator reads a server's CPU time with
``tree_cpu_seconds``; bench_peers.py pauses and stops servers that run in several processes
(Ray's local cluster, mosec's and LitServe's workers, Triton's server) with the others.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path


def stat_fields() -> Iterator[tuple[int, list[str]]]:
    """Every process's ``/proc/<pid>/stat`` fields after its name: state, ppid, pgrp, ...,
    utime at index 11 (``proc(5)``'s numbering less 3). Processes that exit meanwhile are skipped."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            yield int(entry), Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile


def _table() -> tuple[dict[int, list[int]], dict[int, float]]:
    """Children of every process, and every process's CPU seconds: its own user + system time
    and that of its children it has waited for (``cutime``/``cstime``)."""
    kids: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for pid, fields in stat_fields():
        kids.setdefault(int(fields[1]), []).append(pid)
        times[pid] = sum(int(x) for x in fields[11:15]) / tick
    return kids, times


def descendants(pid: int) -> list[int]:
    kids, _ = _table()
    found, todo = [], list(kids.get(pid, ()))
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(kids.get(current, ()))
    return found


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and all its descendants (0 without /proc): the
    cost of a server that runs in several processes (workers, a broker, a proxy). A live
    process counts its own time; one that has exited and been waited for is in its parent's
    children's time, so every process counts once."""
    try:
        kids, times = _table()
    except OSError:
        return 0.0
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += times.get(current, 0.0)
        todo.extend(kids.get(current, ()))
    return total


def signal_tree(pid: int, sig: int) -> None:
    for member in [pid, *descendants(pid)]:
        try:
            os.kill(member, sig)
        except ProcessLookupError:
            pass


def kill_tree_after(pid: int, stop: Callable[[], None]) -> None:
    """End ``pid`` with ``stop()``, then kill whatever it had started that is still there."""
    signal_tree(pid, signal.SIGCONT)  # a paused tree cannot act on SIGTERM
    family = descendants(pid)
    stop()
    for member in family:
        try:
            os.kill(member, signal.SIGKILL)
        except ProcessLookupError:
            pass
