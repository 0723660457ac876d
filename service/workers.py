"""``rlserve serve --workers N``: N server processes on one listening socket.

The parent holds the socket (bound once by ``serve_main`` before anything loads, so a port in
use is refused at once) and starts N worker processes (spawned, not forked:
ONNX Runtime and torch do not survive a fork with their threads) that each run exactly
what a single ``rlserve serve`` runs, the act protocol class included
(``rlserve.service.server.serve``), accepting from the shared socket. uvicorn's own
``workers=N`` cannot be used: it rebuilds the app in each child from an import string
and takes the HTTP protocol as a name, while the act protocol class is built around each
worker's own app.

The parent restarts a worker that dies, and on SIGTERM or SIGINT passes SIGTERM on and
waits for every worker's graceful shutdown (each drains, answers what is in flight, and
exits). A worker whose parent is gone (killed with SIGKILL) stops itself the same way
rather than keep serving the port unsupervised. Sessions need ``RLSERVE_SESSION_STORE``
(each worker holds copies, the store the truth); without it each worker refuses to create
sessions and serves stateless requests.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

from rlserve.service.errors import BundleInvalid
from rlserve.service.server import STARTUP_REFUSED, configure_logging, http_address, one_line, serve
from rlserve.service.serving.checkpoints import parse_checkpoint_arg
from rlserve.service.serving.loading import load_policy
from rlserve.service.settings import Settings

log = logging.getLogger("rlserve.workers")

QUICK_EXIT_S = 10.0  # a worker that dies this soon after its start counts as failing to start
MAX_QUICK_EXITS = 3


def run_workers(settings: Settings, sock: socket.socket) -> int:
    """Serve ``sock`` (bound by ``serve_main`` before anything loaded) with the workers."""
    context = multiprocessing.get_context("spawn")
    if settings.checkpoints:
        # Exported once, into the export cache, by a process of its own (torch stays out of
        # the supervisor): the workers then load the kept bundles, and a checkpoint that
        # cannot be exported is said once rather than by every worker.
        exporter = context.Process(target=_export_checkpoints, args=(settings,), name="rlserve-export")
        exporter.start()
        exporter.join()
        if exporter.exitcode != 0:
            return STARTUP_REFUSED if exporter.exitcode == STARTUP_REFUSED else 1
    log.info("listening on %s with %d workers", http_address(sock), settings.workers)
    stopping = threading.Event()

    def stop(signum: int, frame: Any) -> None:
        stopping.set()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    workers: list[tuple[Any, float]] = []
    quick_exits = 0
    status = 0
    try:
        workers = [_start(context, settings, sock, index) for index in range(settings.workers)]
        while not stopping.wait(0.2):
            for index, (process, started) in enumerate(workers):
                if process.is_alive():
                    continue
                quick_exits = quick_exits + 1 if time.monotonic() - started < QUICK_EXIT_S else 0
                log.warning("worker %d (pid %s) exited with %s", index, process.pid, process.exitcode)
                if process.exitcode == STARTUP_REFUSED:
                    # A named checkpoint did not load (the worker printed why): every
                    # restart would fail the same way, and the command must say so.
                    log.error("worker %d refused to start; stopping", index)
                    stopping.set()
                    status = STARTUP_REFUSED
                    break
                if quick_exits >= MAX_QUICK_EXITS:
                    log.error("workers keep exiting right after they start; stopping")
                    stopping.set()
                    status = 1
                    break
                workers[index] = _start(context, settings, sock, index)
    finally:
        for process, _ in workers:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + settings.shutdown_drain_s + 60.0
        for process, _ in workers:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return status


def _start(context: Any, settings: Settings, sock: socket.socket, index: int) -> tuple[Any, float]:
    process = context.Process(target=_worker, args=(settings, sock), name=f"rlserve-worker-{index}")
    process.start()
    log.info("started worker %d (pid %s)", index, process.pid)
    return process, time.monotonic()


def _worker(settings: Settings, sock: socket.socket) -> None:
    threading.Thread(target=_stop_with_parent, args=(os.getppid(),), daemon=True, name="parent-watch").start()
    try:
        status = serve(settings, sockets=[sock])  # STARTUP_REFUSED: a named checkpoint did not load
    except Exception as exc:  # as a single process says it: one line, the traceback with debug logging
        if settings.log_level == "debug":
            raise
        print(f"rlserve serve: a worker failed to start: {one_line(exc)} (--log-level debug shows the details)",
              file=sys.stderr)
        status = 1
    raise SystemExit(status)


def _export_checkpoints(settings: Settings) -> None:
    """Export every ``--checkpoint`` into the export cache; exit 2 with one line per
    checkpoint that cannot be."""
    configure_logging(settings)
    status = 0
    for spec in settings.checkpoints:
        name, path = parse_checkpoint_arg(spec)
        try:  # what each worker will do, once: export (kept), load, verify
            load_policy(path, settings, name=name).bundle.close()
        except BundleInvalid as exc:
            print(f"rlserve serve: --checkpoint {spec}: {' '.join(exc.message.split())}", file=sys.stderr)
            status = STARTUP_REFUSED
    raise SystemExit(status)


def _stop_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    log.warning("the supervising process %d is gone; shutting down", parent)
    os.kill(os.getpid(), signal.SIGTERM)
