"""Start a real `rlserve serve` process on a free loopback port for end-to-end tests.

Readiness is polled (``/readyz``), never slept for. The process is always terminated.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import httpx

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120.0


def run_script(name: str, *args: str, timeout: float = 300) -> str:
    """Run ``scripts/<name>`` with this interpreter; its stdout (it must exit 0)."""
    done = subprocess.run([sys.executable, str(REPO / "scripts" / name), *args], capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def wait_for(predicate, timeout: float = 30.0, show=lambda: None):
    """Poll ``predicate`` every 50 ms until it returns something true, and return that;
    after ``timeout`` seconds fail, saying what ``show()`` returns."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out: {show()}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rlserve_command() -> list[str]:
    """The installed console script when there is one (what users run), else the module."""
    script = shutil.which("rlserve")
    return [script] if script else [sys.executable, "-m", "rlserve.service.cli"]


def _tail(log: IO[bytes] | None) -> str:
    """The end of what the server wrote so far. Read with pread: the file's offset is shared
    with the running server's stderr, and moving it would make the server write over it."""
    if log is None:
        return ""
    fd = log.fileno()
    return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")[-2000:]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = START_TIMEOUT_S,
               path: str = "/readyz", log: IO[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    # One client for the whole wait: httpx.get would build one per poll, SSL context and all
    # (~50 ms of CPU each, tests/plain_http.py). No kept connection: each poll connects anew.
    with httpx.Client(timeout=2.0, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                err = _tail(log)
                raise RuntimeError(f"rlserve serve exited with {proc.returncode} before it was ready:\n{err}")
            try:
                if client.get(f"{url}{path}").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)  # polling interval, not a wait for a result
    raise TimeoutError(f"rlserve serve not ready at {url} after {timeout}s:\n{_tail(log)}")


@contextmanager
def running_server(args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                   cwd: Path | None = None, ready_path: str = "/readyz",
                   start_timeout: float = START_TIMEOUT_S) -> Iterator[str]:
    """Run `rlserve serve ARGS` with RLSERVE_* taken only from ``env``; yields the base URL.

    ``ready_path="/healthz"`` for a server that is up but has no model yet (not "ready");
    ``start_timeout`` for one that exports many checkpoints before it is ready.
    """
    port = free_port()
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RLSERVE_")}
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    full_env["RLSERVE_PORT"] = str(port)
    full_env.setdefault("RLSERVE_LOG_LEVEL", "warning")
    # stderr goes to a file, not a pipe: an unread pipe fills at 64 KiB and blocks the server.
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([*rlserve_command(), "serve", *args], cwd=cwd or REPO, env=full_env,
                            stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, timeout=start_timeout, path=ready_path, log=log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


class ServerProcess:
    """A `rlserve serve` process the test can kill and start again on the same port
    (for crash, restart and replica tests; ``running_server`` covers the simple case)."""

    def __init__(self, env: Mapping[str, str], args: Sequence[str] = (), port: int | None = None):
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RLSERVE_")}
        self.env["PYTHONPATH"] = str(REPO) + os.pathsep + self.env.get("PYTHONPATH", "")
        self.env.setdefault("RLSERVE_LOG_LEVEL", "warning")
        self.env.update(env)
        # A temporary folder of its own, emptied by ``kill``, ``terminate`` and ``stop``: these tests SIGKILL servers,
        # which leaves their unpacked bundles (rlsb-*) where no shutdown deletes them.
        self._scratch: str | None = None
        if "TMPDIR" not in env:
            self._scratch = self.env["TMPDIR"] = tempfile.mkdtemp(prefix="rlserve-server-tmp-")
        self.port = port or free_port()
        self.env["RLSERVE_PORT"] = str(self.port)
        self.args = list(args)
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log: IO[bytes] | None = None

    def start(self, wait: bool = True) -> ServerProcess:
        if self._scratch is not None:
            os.makedirs(self._scratch, exist_ok=True)
        self.log = tempfile.TemporaryFile()
        # Its own process group: kill() and stop() reach its workers too (``--workers``).
        self.proc = subprocess.Popen([*rlserve_command(), "serve", *self.args], cwd=REPO, env=self.env,
                                     stdout=subprocess.DEVNULL, stderr=self.log, start_new_session=True)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self) -> None:
        assert self.proc is not None
        wait_ready(self.url, self.proc, log=self.log)

    def kill(self) -> None:
        """SIGKILL to every process of the server: no shutdown of any kind, as an
        out-of-memory kill or the loss of its node."""
        assert self.proc is not None
        self._kill_group()
        self.proc.wait()
        self._clear_scratch()

    def _kill_group(self) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM and wait for the graceful shutdown; returns the exit code."""
        assert self.proc is not None
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        finally:
            self._clear_scratch()

    def output(self) -> str:
        return _tail(self.log)

    def stop(self) -> None:
        if self.proc is not None:
            self._kill_group()  # workers too, even when the supervisor already exited
            self.proc.wait()
        if self.log is not None:
            self.log.close()
            self.log = None
        self._clear_scratch()

    def _clear_scratch(self) -> None:
        """What the killed server left in its temporary folder (start() makes it again)."""
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
