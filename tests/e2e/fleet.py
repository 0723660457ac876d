"""The client side of the durability tests: seeded LSTM episodes driven over HTTP through a
small load balancer of the test's own (``Fleet``), an in-process reference run, and the
``rlserve serve`` replicas behind it (``replica_processes``).

Every step carries its index (``"step": t``), so a step whose answer was lost (its
server was killed with the request in flight) is sent again, to any replica, and
answered exactly once. Observations depend only on (session, step), so an episode's
answers can be compared step for step with an uninterrupted run.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from server_process import ServerProcess

MODEL = "cartpole-memory"  # the embedded LSTM policy (obs Box(2), Discrete(2))
ACT = f"/v1/models/{MODEL}/act"


def model_repository(parent: Path) -> Path:
    """A repository under ``parent`` holding a copy of the embedded ``MODEL`` only."""
    from rlserve.service.app import DEFAULT_MODELS

    repo = parent / "models"
    repo.mkdir()
    shutil.copytree(DEFAULT_MODELS / MODEL, repo / MODEL)
    return repo


def replica_processes(store_url: str, repository: Path) -> Iterator[Callable[..., list[ServerProcess]]]:
    """A fixture's body: ``make(n, **env)`` starts n server processes sharing the session
    store at ``store_url`` and ``repository``; every one started is stopped at the end."""
    started: list[ServerProcess] = []

    def make(n: int = 1, **env: str) -> list[ServerProcess]:
        base = {"RLSERVE_REPOSITORY": str(repository), "RLSERVE_SESSION_STORE": store_url,
                "RLSERVE_MAX_SESSIONS": "1000"}
        servers = [ServerProcess({**base, **env}) for _ in range(n)]
        started.extend(servers)
        for server in servers:
            server.start(wait=False)
        for server in servers:
            server.wait_ready()
        return servers

    yield make
    for server in started:
        server.stop()


def observation(session: int, t: int) -> list[float]:
    return np.random.default_rng(session * 1009 + t).uniform(-1, 1, 2).round(5).tolist()


def step_body(session: int, t: int) -> dict[str, Any]:
    body: dict[str, Any] = {"observation": observation(session, t), "session_id": f"s{session}", "step": t,
                            "outputs": ["dist_inputs"]}
    if t == 0:
        body.update(episode_start=True, seed=1000 + session)
    else:
        body["reward"] = 1.0
    return body


class LostInFlight(Exception):
    """The request went out; the connection broke before a whole answer came back."""


class NoAnswer(LostInFlight):
    """The connection broke before any byte of an answer: a kept-alive connection a
    stopping server closed as the request went out, a queued connection it never
    accepted, or a server killed mid-request. A load balancer sends such a request to
    another server (HAProxy's retry-on empty-response), safe with a step index."""


class Lane:
    """One keep-alive HTTP/1.1 connection, one request at a time. The tests drive
    thousands of steps through a few of these: httpx's connection pool spends
    milliseconds per request once many requests wait for a connection."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(status, JSON body). OSError (refused) when no server listens: nothing was
        sent; ``NoAnswer`` or ``LostInFlight`` when the request may have reached one."""
        if self.reader is not None and self.reader.at_eof():
            self.close()  # the server closed it while it was idle
        if self.writer is None:
            await self.connect()
        assert self.reader is not None and self.writer is not None
        payload = json.dumps(body).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n").encode()
        try:
            self.writer.write(head + payload)
            await self.writer.drain()
            head_bytes = await self.reader.readuntil(b"\r\n\r\n")
        except (OSError, asyncio.IncompleteReadError) as exc:
            self.close()
            if isinstance(exc, asyncio.IncompleteReadError) and exc.partial:
                raise LostInFlight(f"the answer broke off: {exc}") from exc
            raise NoAnswer(f"{type(exc).__name__}: {exc}") from exc
        try:
            lines = head_bytes.split(b"\r\n")
            status = int(lines[0].split()[1])
            length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length:"))
            data = await self.reader.readexactly(length)
        except (OSError, asyncio.IncompleteReadError, ValueError, StopIteration) as exc:
            self.close()
            raise LostInFlight(f"the answer broke off: {type(exc).__name__}: {exc}") from exc
        if any(line.lower() == b"connection: close" for line in lines):
            self.close()
        return status, json.loads(data)

    async def connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class Replica:
    """Idle lanes to one server, opened on demand."""

    def __init__(self, url: str):
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.idle: list[Lane] = []

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        lane = self.idle.pop() if self.idle else Lane(self.host, self.port)
        status, answer = await lane.post(path, body)  # a lane that failed is dropped with it
        self.idle.append(lane)
        return status, answer

    def close(self) -> None:
        for lane in self.idle:
            lane.close()
        self.idle.clear()


@dataclass
class Fleet:
    """The test's load balancer: sends each request to a preferred replica and fails over
    to the next one when a replica refuses connections, loses a request in flight, or
    says it is not ready. Counts what the client saw."""

    urls: list[str]
    refused: int = 0  # connection refused: the request never reached a server
    no_answer: int = 0  # sent, then the connection broke before any byte of an answer
    lost_in_flight: int = 0  # the connection broke in the middle of an answer
    not_ready: int = 0  # 503 not_ready / session_store_unavailable from a stopping replica
    errors: list[tuple[int, str]] = field(default_factory=list)  # any other error answer
    answered: int = 0
    replicas: list[Replica] = field(default_factory=list)
    _milestones: list[tuple[int, asyncio.Event]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.replicas = [Replica(u) for u in self.urls]

    async def close(self) -> None:
        for replica in self.replicas:
            replica.close()

    def reached(self, answered: int) -> asyncio.Event:
        event = asyncio.Event()
        self._milestones.append((answered, event))
        return event

    async def send(self, prefer: int, body: dict[str, Any], deadline_s: float = 90.0) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + deadline_s
        attempt = 0
        while True:
            replica = (prefer + attempt) % len(self.replicas)
            attempt += 1
            try:
                status, answer = await self.replicas[replica].post(ACT, body)
            except OSError:  # refused: nothing was sent
                self.refused += 1
            except NoAnswer:
                self.no_answer += 1
            except LostInFlight:
                self.lost_in_flight += 1
            else:
                if status == 200:
                    self._answered()
                    return answer
                code = answer.get("error", {}).get("code")
                if status == 503 and code in ("not_ready", "session_store_unavailable"):
                    self.not_ready += 1
                else:
                    self.errors.append((status, json.dumps(answer)))
                    raise AssertionError(f"replica {replica} answered {status}: {answer}")
            if loop.time() > give_up:
                raise TimeoutError(f"no replica answered {body} within {deadline_s}s")
            if attempt % len(self.replicas) == 0:
                await asyncio.sleep(0.02)  # every replica refused: one is restarting; poll again

    def _answered(self) -> None:
        self.answered += 1
        for goal, event in self._milestones:
            if self.answered >= goal:
                event.set()


async def run_episodes(send: Callable[[int, int, dict[str, Any]], Any], sessions: int, steps: int,
                       concurrency: int = 48) -> list[list[tuple[int, list[float]]]]:
    """Every session's (action, logits) per step; ``send(session, t, body)`` answers a step.
    All sessions advance together, at most ``concurrency`` requests at a time."""
    slots = asyncio.Semaphore(concurrency)

    async def episode(session: int) -> list[tuple[int, list[float]]]:
        answers = []
        for t in range(steps):
            async with slots:
                answer = await send(session, t, step_body(session, t))
            answers.append((answer["action"], answer["dist_inputs"]))
        return answers

    return list(await asyncio.gather(*(episode(s) for s in range(sessions))))


async def reference_run(repository, sessions: int, steps: int) -> list[list[tuple[int, list[float]]]]:
    """The same episodes on an in-process app with in-process sessions, never interrupted."""
    from rlserve.service.app import create_app
    from rlserve.service.settings import Settings

    app = create_app(Settings(repository=repository, max_sessions=max(sessions, 16)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://reference") as client:
        async def send(session: int, t: int, body: dict[str, Any]) -> dict[str, Any]:
            response = await client.post(ACT, json=body)
            assert response.status_code == 200, response.text
            return response.json()

        return await run_episodes(send, sessions, steps)


def assert_same_episodes(got: list[list[tuple[int, list[float]]]],
                         expected: list[list[tuple[int, list[float]]]]) -> None:
    """Actions equal step for step (the seeded generators continued exactly); the logits
    (a function of the recurrent state) equal up to float32 rounding (the batch a step ran
    in may differ, and with it the last bits of the runtime's sums)."""
    assert len(got) == len(expected)
    for session, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        assert [a for a, _ in mine] == [a for a, _ in theirs], f"session s{session} took other actions"
        np.testing.assert_allclose([d for _, d in mine], [d for _, d in theirs], rtol=1e-4, atol=1e-4,
                                   err_msg=f"session s{session} moved to another state")
