"""A real ``redis-server`` for the tests of the external session store (no fake Redis).

Each server runs on a free loopback port and a unix socket in a temporary directory,
without persistence (the tests kill rlserve processes, never Redis). Without the binary
these tests fail with a message saying how to install it (they never skip themselves:
``.ci/run`` installs it, and a developer installs it once).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

INSTALL_HINT = "install it (Debian/Ubuntu: apt-get install redis-server) to run the external session store tests"


def redis_binary() -> str:
    """The ``redis-server`` path; fails the test when there is none."""
    path = shutil.which("redis-server")
    if path is None:
        pytest.fail(f"redis-server is not on PATH: {INSTALL_HINT}")
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class RedisServer:
    port: int
    unix_socket: Path
    process: subprocess.Popen

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def unix_url(self) -> str:
        return f"unix://{self.unix_socket}?db=0"

    def client(self):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)


@contextmanager
def running_redis(workdir: Path) -> Iterator[RedisServer]:
    binary = redis_binary()
    workdir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    sock = workdir / "redis.sock"
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir), "--save", "",
         "--appendonly", "no", "--unixsocket", str(sock), "--unixsocketperm", "700", "--daemonize", "no",
         "--logfile", str(workdir / "redis.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = RedisServer(port, sock, proc)
    try:
        _wait_ready(server, workdir)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_ready(server: RedisServer, workdir: Path, timeout: float = 20.0) -> None:
    import redis

    deadline = time.monotonic() + timeout
    client = server.client()
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            log = (workdir / "redis.log").read_text(errors="replace") if (workdir / "redis.log").exists() else ""
            raise RuntimeError(f"redis-server exited with {server.process.returncode}:\n{log[-2000:]}")
        try:
            if client.ping():
                return
        except redis.exceptions.ConnectionError:
            time.sleep(0.02)  # polling interval while it starts
    raise TimeoutError(f"redis-server not answering on port {server.port} after {timeout}s")
