"""The candidate process's priority: every thread lowered (SCHED_IDLE where the system has
it, nice 19), and an ordinary policy again for its stop (a real process with two threads)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from rlserve.service.shadow.process import NICE, lower_priority, stopping_priority

TWO_THREADS = ("import threading, time; threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); "
               "time.sleep(30)")


def _threads(pid: int) -> list[tuple[int, int]]:
    """(policy, nice) of each thread of ``pid``."""
    return [(os.sched_getscheduler(int(t)), os.getpriority(os.PRIO_PROCESS, int(t)))
            for t in os.listdir(f"/proc/{pid}/task")]


def test_every_thread_is_lowered_and_back_to_an_ordinary_policy_for_the_stop():
    proc = subprocess.Popen([sys.executable, "-c", TWO_THREADS])
    try:
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{proc.pid}/task")) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert lower_priority(proc.pid) == "SCHED_IDLE"
        assert _threads(proc.pid) == [(os.SCHED_IDLE, NICE)] * 2
        stopping_priority(proc.pid)
        assert _threads(proc.pid) == [(os.SCHED_OTHER, NICE)] * 2
    finally:
        proc.kill()
        proc.wait()
