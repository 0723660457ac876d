"""Sessions that survive a crash and are served by any replica: real redis-server, real
`rlserve serve` processes, killed with SIGKILL or stopped with SIGTERM under load.

Each test drives 200 seeded LSTM episodes (the embedded ``cartpole-memory`` policy) over
HTTP and compares every answer with an uninterrupted in-process run: the actions equal
step for step (so the seeded generators continued exactly) and so do the logits (so the
recurrent state did). A step in flight when its server died is sent again with the same
step index and answered once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from fleet import (
    ACT,
    MODEL,
    Fleet,
    assert_same_episodes,
    model_repository,
    observation,
    reference_run,
    replica_processes,
    run_episodes,
    step_body,
)
from race import assert_linear_history, race, race_body
from server_process import ServerProcess

from rlserve.service.app import DEFAULT_MODELS

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio]

SESSIONS, STEPS = 200, 10


@pytest.fixture
def repository(tmp_path) -> Path:
    return model_repository(tmp_path)


@pytest.fixture
def replicas(redis_server, repository):
    """``replicas(n, **env)``: n server processes sharing the redis-server and the repository."""
    yield from replica_processes(redis_server.url, repository)


async def _reference(repository: Path):
    return await reference_run(repository, SESSIONS, STEPS)


async def test_a_killed_server_restarts_and_every_session_continues(replicas, repository):
    [server] = replicas(1)
    fleet = Fleet([server.url])
    halfway = fleet.reached(SESSIONS * STEPS // 2)

    async def crash() -> None:
        await halfway.wait()
        server.kill()  # SIGKILL with requests in flight
        killed_at = fleet.answered
        await asyncio.to_thread(server.start)  # same port, nothing cached
        assert killed_at < SESSIONS * STEPS

    try:
        crasher = asyncio.create_task(crash())
        got = await run_episodes(lambda s, t, body: fleet.send(0, body), SESSIONS, STEPS)
        await crasher
    finally:
        await fleet.close()
    assert_same_episodes(got, await _reference(repository))
    assert fleet.errors == []
    assert fleet.refused + fleet.no_answer > 0  # the kill did interrupt traffic


async def test_two_replicas_alternating_steps_with_one_killed(replicas, repository):
    servers = replicas(2)
    fleet = Fleet([s.url for s in servers])
    halfway = fleet.reached(SESSIONS * STEPS // 2)

    async def crash() -> None:
        await halfway.wait()
        servers[0].kill()  # its share of the steps goes to the other replica meanwhile
        await asyncio.to_thread(servers[0].start)

    try:
        crasher = asyncio.create_task(crash())
        # Step t of every session goes to replica t % 2: no copy held anywhere is ever current.
        got = await run_episodes(lambda s, t, body: fleet.send(t % 2, body), SESSIONS, STEPS)
        await crasher
    finally:
        await fleet.close()
    assert_same_episodes(got, await _reference(repository))
    assert fleet.errors == []


async def test_rolling_restart_under_load_fails_no_request(replicas, repository):
    servers = replicas(2, RLSERVE_SHUTDOWN_DRAIN_S="0.3")
    fleet = Fleet([s.url for s in servers])
    started = fleet.reached(SESSIONS * STEPS // 5)
    # Each restart must meet traffic whatever the machine's speed: on a quiet one the
    # episodes once ended within the first drain, and no request saw a replica go. Steps
    # STEPS // 2 and STEPS - 2 wait until the first and the second replica are down, so
    # each replica's later steps are sent while it restarts (and fail over to the other).
    # The first stop starts after a fifth of the steps, long before any session reaches
    # a gate (sessions advance together), so the gates never hold every request slot.
    down = [asyncio.Event(), asyncio.Event()]
    gates = {STEPS // 2: down[0], STEPS - 2: down[1]}
    exit_codes = []

    async def roll() -> None:
        await started.wait()
        for server, is_down in zip(servers, down, strict=True):
            exit_codes.append(await asyncio.to_thread(server.terminate))  # SIGTERM: drain, finish, exit
            is_down.set()
            await asyncio.to_thread(server.start)

    async def send(session: int, t: int, body: dict) -> dict:
        gate = gates.get(t)
        if gate is not None:
            await gate.wait()
        return await fleet.send(session % 2, body)

    try:
        roller = asyncio.create_task(roll())
        got = await run_episodes(send, SESSIONS, STEPS)
        await roller
    finally:
        await fleet.close()
    assert exit_codes == [0, 0]
    assert fleet.errors == []  # no request answered with an error
    # A graceful stop answers every request it read. The client only sees connections
    # refused, and connections closed before any answer (kept-alive ones closed as a
    # request went out, queued ones never accepted); both are sent to the other replica.
    assert fleet.lost_in_flight == 0, fleet
    assert fleet.refused + fleet.no_answer > 0  # the restarts did happen under load
    assert_same_episodes(got, await _reference(repository))


async def test_two_replicas_racing_on_one_session_never_fork(replicas):
    # Each replica gathers what arrives within 50 ms into one batch: the two batches that
    # hold a session's two steps start within a millisecond of each other, so each one's
    # read happens before the other's write whatever the machine's load.
    servers = replicas(2, RLSERVE_MAX_BATCH_DELAY_MS="50")
    racers, conflicts = 40, 0
    async with httpx.AsyncClient(timeout=30) as client:
        for attempt in range(3):  # a round where one replica ran late serializes: try again
            sessions = range(attempt * racers, (attempt + 1) * racers)
            started = await asyncio.gather(*(client.post(servers[0].url + ACT, json=step_body(k, 0))
                                             for k in sessions))
            assert all(r.status_code == 200 for r in started)
            pairs = await race(servers, sessions, ACT, lambda k, i: race_body(k, "ab"[i]))
            for k, (a, b) in zip(sessions, pairs, strict=True):
                codes = sorted((a.status_code, b.status_code))
                assert codes in ([200, 200], [200, 409]), (k, a.text, b.text)
                for response in (a, b):
                    if response.status_code == 409:
                        conflicts += 1
                        error = response.json()["error"]
                        assert error["code"] == "session_conflict" and f"'s{k}'" in error["message"]
            await asyncio.gather(*(assert_linear_history(client, servers, k, a, b)
                                   for k, (a, b) in zip(sessions, pairs, strict=True)))
            if conflicts:
                break
    assert conflicts > 0, "no pair overlapped in three rounds: the race was not exercised"


async def test_workers_share_sessions_through_the_store(replicas, repository):
    [server] = replicas(1, RLSERVE_WORKERS="2")
    assert len(_spawned_children(server.proc.pid)) == 2
    sessions, steps = 20, 6
    # A new connection per request: the kernel hands each to either worker.
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=limits) as client:
        async def send(session: int, t: int, body: dict) -> dict:
            response = await client.post(ACT, json=body)
            assert response.status_code == 200, response.text
            return response.json()

        got = await run_episodes(send, sessions, steps)
    assert_same_episodes(got, await reference_run(repository, sessions, steps))
    # Workers whose supervisor was killed stop themselves instead of serving unsupervised.
    workers = _spawned_children(server.proc.pid)
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait()
    deadline = time.monotonic() + 20
    while any(Path(f"/proc/{pid}").exists() and b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
              for pid in workers):
        assert time.monotonic() < deadline, "workers outlived their supervisor"
        await asyncio.sleep(0.1)  # polling interval


async def test_workers_without_a_store_refuse_sessions_but_act(repository):
    server = ServerProcess({"RLSERVE_REPOSITORY": str(repository)}, args=["--workers", "2"])
    try:
        server.start()
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            refused = await client.post(f"/v1/models/{MODEL}/sessions", json={})
            assert refused.status_code == 503
            assert "RLSERVE_SESSION_STORE" in refused.json()["error"]["message"]
            for _ in range(20):
                assert (await client.post(ACT, json={"observation": [0.1, 0.2]})).status_code == 200
        # Each worker says so when it starts; the port answers once one of them is ready, so
        # on a busy machine the other may still be starting here.
        deadline = time.monotonic() + 60
        while server.output().count("creating sessions is refused") < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # polling interval
        assert server.output().count("creating sessions is refused") == 2, server.output()
        assert server.terminate() == 0
    finally:
        server.stop()


async def test_sigterm_drains_reporting_not_ready(replicas):
    [server] = replicas(1, RLSERVE_SHUTDOWN_DRAIN_S="3")
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        assert (await client.get("/readyz")).status_code == 200
        os.kill(server.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while (await client.get("/readyz")).status_code != 503:
            assert time.monotonic() < deadline, "never reported not ready"
        # Draining: not ready, still answering.
        answer = await client.post(ACT, json=step_body(1, 0))
        assert answer.status_code == 200
    assert await asyncio.to_thread(server.proc.wait, 30) == 0


async def test_models_loaded_on_one_replica_reach_the_other(replicas, tmp_path):
    from rlserve.models.export.bundle import pack_bundle

    token = "t0k3n"
    a, b = replicas(2, RLSERVE_ADMIN_TOKEN=token, RLSERVE_REPOSITORY_POLL_S="0.2")
    archive = pack_bundle(DEFAULT_MODELS / "cartpole", tmp_path / "cartpole.rlsb")
    headers = {"authorization": f"Bearer {token}", "content-type": "application/octet-stream"}
    async with httpx.AsyncClient(timeout=30) as client:
        assert (await client.get(b.url + "/v1/models/cartpole")).status_code == 404
        loaded = await client.post(a.url + "/v1/admin/models", content=archive.read_bytes(), headers=headers)
        assert loaded.status_code == 201, loaded.text
        deadline = time.monotonic() + 30
        while (await client.get(b.url + "/v1/models/cartpole")).status_code != 200:
            assert time.monotonic() < deadline, "replica b never loaded the uploaded model"
            await asyncio.sleep(0.1)  # polling interval of the test, not a wait for a result
        # A session of the new model, stepped on both replicas in turn.
        for t in range(4):
            body = {"observation": observation(3, t) * 2, "session_id": "new", "step": t}
            if t == 0:
                body.update(episode_start=True, seed=5)
            r = await client.post((a, b)[t % 2].url + "/v1/models/cartpole/act", json=body)
            assert r.status_code == 200, r.text
        # a's own poll does not load its upload a second time.
        listed = (await client.get(a.url + "/v1/admin/models", headers={"authorization": f"Bearer {token}"})).json()
        assert [m["name"] for m in listed["models"]].count("cartpole") == 1


def _spawned_children(pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"spawn_main" in cmdline:
            children.append(int(entry.name))
    return children
