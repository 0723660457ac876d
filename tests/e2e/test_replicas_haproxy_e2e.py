"""The replicas profile as shipped: docker/haproxy.cfg in a real HAProxy in front of two
real `rlserve serve` replicas sharing a real redis-server.

The compose file itself needs a container engine; everything it wires together runs here
as processes, with the shipped HAProxy configuration changed only where compose's service
names and ports become this test's loopback ports, plus a stats socket through which the
test sees which replicas HAProxy has in its pool (``render_config`` refuses a file in which
those lines moved, so the test follows the shipped file, not a copy of it).

- Routing: the balance key is the session id, so each session's steps stay on one replica
  (no replica ever reads a session from the store) while both replicas take sessions.
- A rolling restart of both replicas under load, with the replicas' drain setting and
  HAProxy's health checks and retries as shipped: the client sees no failed request of any
  kind, and every episode equals an uninterrupted run step for step.

HAProxy must be on PATH (Debian/Ubuntu: ``apt-get install haproxy``; ``.ci/run`` installs
it when it is missing); without it these tests fail, they do not skip.
"""

from __future__ import annotations

import asyncio
import csv
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet import MODEL, Fleet, assert_same_episodes, model_repository, reference_run, run_episodes, step_body
from plain_http import HTTP
from server_process import REPO, ServerProcess, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio]

SHIPPED = REPO / "docker" / "haproxy.cfg"
INSTALL_HINT = "install it (Debian/Ubuntu: apt-get install haproxy) to run the load balancer tests"
# What a replica of docker/compose.yaml sets for a graceful stop, shortened from 5 s: HAProxy
# checks /readyz every second and takes a replica out after 2 failures, so 2.5 s of
# draining still covers the time until it is out of the pool.
DRAIN_S = "2.5"


def render_config(text: str, lb_port: int, replica_ports: dict[str, int], stats_socket: Path) -> str:
    """The shipped configuration with compose's addresses replaced by loopback ports, and
    HAProxy's runtime API on ``stats_socket``."""
    replacements = {"\nglobal\n": f"\nglobal\n    stats socket {stats_socket} mode 600 level admin\n",
                    "    bind :8000\n": f"    bind 127.0.0.1:{lb_port}\n"}
    for name, port in replica_ports.items():
        replacements[f"    server {name} {name}:8000\n"] = f"    server {name} 127.0.0.1:{port}\n"
    for old, new in replacements.items():
        assert text.count(old) == 1, f"docker/haproxy.cfg changed: {old.strip()!r} is not there exactly once"
        text = text.replace(old, new)
    return text


def _haproxy_binary() -> str:
    path = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/sbin")  # off a non-root PATH
    if path is None:
        pytest.fail(f"haproxy is not on PATH: {INSTALL_HINT}")
    return path


def _metric(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include ``labels`` (0 when none)."""
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", line)
        if match is None:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match[1] or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(match[2])
    return total


@pytest.fixture
def repository(tmp_path) -> Path:
    return model_repository(tmp_path)


class Balancer:
    """A running HAProxy on the shipped configuration and the replicas behind it."""

    def __init__(self, url: str, replicas: dict[str, ServerProcess], stats_socket: Path):
        self.url = url
        self.replicas = replicas
        self.stats_socket = stats_socket

    def states(self) -> dict[str, str]:
        """HAProxy's status of each server of the ``replicas`` backend ("UP", "DOWN", ...)."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(self.stats_socket))
            sock.sendall(b"show stat\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        rows = csv.reader(data.decode().lstrip("# ").splitlines())
        header = next(rows)
        at = {name: header.index(name) for name in ("pxname", "svname", "status")}
        return {row[at["svname"]]: row[at["status"]] for row in rows
                if len(row) > at["status"] and row[at["pxname"]] == "replicas" and row[at["svname"]] in self.replicas}

    def wait_up(self, names: list[str], timeout: float = 30.0) -> None:
        """Until HAProxy's health checks have every one of ``names`` in the pool."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.states()
            if all(states.get(name, "").startswith("UP") for name in names):
                return
            time.sleep(0.1)  # polling interval
        raise TimeoutError(f"HAProxy did not take {names} into its pool within {timeout}s: {self.states()}")


@pytest.fixture
def balanced(redis_server, repository) -> Iterator[Balancer]:
    """Both replicas up and in HAProxy's pool."""
    binary = _haproxy_binary()
    env = {"RLSERVE_REPOSITORY": str(repository), "RLSERVE_SESSION_STORE": redis_server.url,
           "RLSERVE_MAX_SESSIONS": "1000", "RLSERVE_SHUTDOWN_DRAIN_S": DRAIN_S}
    replicas = {name: ServerProcess(env) for name in ("rlserve-a", "rlserve-b")}
    lb_port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        stats_socket = Path(tmp) / "haproxy.sock"
        config = Path(tmp) / "haproxy.cfg"
        config.write_text(render_config(SHIPPED.read_text(), lb_port, {n: r.port for n, r in replicas.items()},
                                        stats_socket))
        check = subprocess.run([binary, "-c", "-f", str(config)], capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, f"haproxy -c refused the shipped configuration:\n{check.stdout}{check.stderr}"
        log = (Path(tmp) / "haproxy.log").open("wb")
        proxy: subprocess.Popen | None = None
        try:
            for replica in replicas.values():
                replica.start(wait=False)
            for replica in replicas.values():
                replica.wait_ready()
            proxy = subprocess.Popen([binary, "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
            balancer = Balancer(f"http://127.0.0.1:{lb_port}", replicas, stats_socket)
            deadline = time.monotonic() + 30
            while not stats_socket.exists():
                assert proxy.poll() is None and time.monotonic() < deadline, "haproxy did not start"
                time.sleep(0.05)  # polling interval
            balancer.wait_up(list(replicas))
            yield balancer
        finally:
            if proxy is not None:
                proxy.terminate()
                proxy.wait(timeout=10)
            for replica in replicas.values():
                replica.stop()
            log.close()


async def test_each_session_stays_on_one_replica(balanced, repository):
    replicas = balanced.replicas
    sessions, steps = 60, 6
    fleet = Fleet([balanced.url])
    try:
        got = await run_episodes(lambda s, t, body: fleet.send(0, body), sessions, steps)
    finally:
        await fleet.close()
    assert fleet.errors == [] and fleet.refused == fleet.no_answer == fleet.lost_in_flight == 0, fleet
    assert_same_episodes(got, await reference_run(repository, sessions, steps))
    served, held, loads = {}, {}, {}
    for name, replica in replicas.items():
        text = HTTP.get(f"{replica.url}/metrics", timeout=10).text
        served[name] = _metric(text, "rlserve_observations_total", model=MODEL)
        held[name] = _metric(text, "rlserve_active_sessions", model=MODEL)
        # A replica reads a session it does not hold from the store (one load per request
        # that brings new sessions), and finds a copy stale when another replica stepped it.
        loads[name] = _metric(text, "rlserve_session_store_seconds_count", op="load")
        assert _metric(text, "rlserve_session_cache_total", result="miss") == 0, name
    assert sum(served.values()) == sessions * steps
    # Every session was read once, by the replica its id hashes to, and is held by it alone.
    assert sum(held.values()) == sum(loads.values()) == sessions, (held, loads)
    assert all(count > 0 for count in served.values()), f"one replica took every session: {served}"


async def test_rolling_restart_through_haproxy_fails_no_request(balanced, repository):
    """Each replica in turn: SIGTERM (it drains), started again, back in the pool. Sessions
    keep running whole episodes (the same seeded episode again each time) until both
    restarts are over; the client sees not one refused, broken or failed request."""
    replicas = balanced.replicas
    sessions, steps = 48, 8
    fleet = Fleet([balanced.url])
    rolled = asyncio.Event()
    exit_codes: list[int] = []

    async def roll() -> None:
        try:
            for name, replica in replicas.items():
                await asyncio.sleep(1.0)  # under load first
                exit_codes.append(await asyncio.to_thread(replica.terminate))
                await asyncio.to_thread(replica.start)
                await asyncio.to_thread(balanced.wait_up, [name])
        finally:
            rolled.set()

    async def keep_stepping(session: int) -> list[list[tuple[int, list[float]]]]:
        episodes = []
        while not rolled.is_set() or not episodes:
            answers = []
            for t in range(steps):
                answer = await fleet.send(0, step_body(session, t))
                answers.append((answer["action"], answer["dist_inputs"]))
            episodes.append(answers)
        return episodes

    try:
        roller = asyncio.create_task(roll())
        runs = await asyncio.gather(*(keep_stepping(s) for s in range(sessions)))
        await roller
    finally:
        await fleet.close()
    assert exit_codes == [0, 0]
    # The replica restarted first took traffic again (while the second one restarted).
    first = next(iter(replicas.values()))
    assert _metric(HTTP.get(f"{first.url}/metrics", timeout=10).text, "rlserve_observations_total", model=MODEL) > 0
    assert fleet.errors == [], fleet.errors
    assert fleet.refused == fleet.no_answer == fleet.lost_in_flight == fleet.not_ready == 0, fleet
    reference = await reference_run(repository, sessions, steps)
    episodes = [(session, episode) for session, run in enumerate(runs) for episode in run]
    assert len(episodes) > 2 * sessions  # the load went on across both restarts
    for session, episode in episodes:
        assert_same_episodes([episode], [reference[session]])
