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
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from fleet import (
    ACT,
    MODEL,
    Fleet,
    Lane,
    Replica,
    assert_same_episodes,
    model_repository,
    observation,
    reference_run,
    run_episodes,
    step_body,
)
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
    started: list[ServerProcess] = []

    def make(n: int = 1, **env: str) -> list[ServerProcess]:
        base = {"RLSERVE_REPOSITORY": str(repository), "RLSERVE_SESSION_STORE": redis_server.url,
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
            pairs = await _race(servers, sessions, ACT, lambda k, i: _race_body(k, "ab"[i]))
            for k, (a, b) in zip(sessions, pairs, strict=True):
                codes = sorted((a.status_code, b.status_code))
                assert codes in ([200, 200], [200, 409]), (k, a.text, b.text)
                for response in (a, b):
                    if response.status_code == 409:
                        conflicts += 1
                        error = response.json()["error"]
                        assert error["code"] == "session_conflict" and f"'s{k}'" in error["message"]
            await asyncio.gather(*(_assert_linear_history(client, servers, k, a, b)
                                   for k, (a, b) in zip(sessions, pairs, strict=True)))
            if conflicts:
                break
    assert conflicts > 0, "no pair overlapped in three rounds: the race was not exercised"


@dataclass
class _Answer:
    status_code: int
    body: dict

    def json(self) -> dict:
        return self.body

    @property
    def text(self) -> str:
        return json.dumps(self.body)


async def _race(servers, sessions, path: str, body: Callable[[int, int], dict]) -> list[tuple[_Answer, _Answer]]:
    """Each session's two steps (``body(k, replica)``), one to each replica, all written
    within a millisecond: connections are opened first, then every request goes out before
    any answer is read."""
    lanes = {(k, i): Replica(servers[i].url) for k in sessions for i in (0, 1)}
    for replica in lanes.values():  # connect now, so the sends below are only writes
        lane = Lane(replica.host, replica.port)
        await lane.connect()
        replica.idle.append(lane)

    async def send(k: int, i: int) -> _Answer:
        status, answer = await lanes[k, i].post(path, body(k, i))
        return _Answer(status, answer)

    try:
        return list(await asyncio.gather(*(asyncio.gather(send(k, 0), send(k, 1)) for k in sessions)))
    finally:
        for replica in lanes.values():
            replica.close()


def _race_body(session: int, which: str) -> dict:
    obs = [0.5, -0.5] if which == "a" else [-0.9, 0.9]
    return {"observation": obs, "session_id": f"s{session}", "reward": 1.0, "outputs": ["dist_inputs"]}


async def _assert_linear_history(client, servers, k: int, a: _Answer, b: _Answer) -> None:
    """The stored session is the initial step followed by exactly the steps answered 200,
    in one order, and each 200 answer is what that order computes (no forked state)."""
    winners = [(which, r.json()) for which, r in (("a", a), ("b", b)) if r.status_code == 200]
    url = f"/v1/models/{MODEL}/sessions/s{k}"
    info = (await client.get(servers[1].url + url)).json()
    assert info["steps"] == 1 + len(winners)
    probe = {"observation": [0.1, 0.1], "session_id": f"s{k}", "explore": False, "outputs": ["dist_inputs"]}
    stored_next = (await client.post(servers[0].url + ACT, json=probe)).json()["dist_inputs"]
    app_orders = [winners] if len(winners) == 1 else [winners, winners[::-1]]
    for order in app_orders:
        replay = await _replay(k, [which for which, _ in order])
        answers_match = all(np.allclose(got["dist_inputs"], expected, rtol=1e-4, atol=1e-4)
                            for (_, got), expected in zip(order, replay[:-1], strict=True))
        if answers_match and np.allclose(stored_next, replay[-1], rtol=1e-4, atol=1e-4):
            return
    raise AssertionError(f"session s{k}: the stored state is no linear history of the answered steps {winners}")


_REFERENCE_APPS: dict[str, object] = {}


async def _replay(k: int, order: list[str]) -> list[list[float]]:
    """Logits of the racing steps applied in ``order`` on an in-process app, then of the probe."""
    from rlserve.service.app import create_app
    from rlserve.service.settings import Settings

    app = _REFERENCE_APPS.get("app") or _REFERENCE_APPS.setdefault("app", create_app(Settings()))
    sid = f"ref-{k}-{''.join(order)}-{time.monotonic_ns()}"
    out = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ref") as client:
        first = step_body(k, 0)
        first["session_id"] = sid
        await client.post(ACT, json=first)
        for which in order:
            body = _race_body(k, which)
            body["session_id"] = sid
            out.append((await client.post(ACT, json=body)).json()["dist_inputs"])
        probe = {"observation": [0.1, 0.1], "session_id": sid, "explore": False, "outputs": ["dist_inputs"]}
        out.append((await client.post(ACT, json=probe)).json()["dist_inputs"])
    return out


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
    from rlserve.models.export.archive import pack_bundle

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


# --------------------------------------------------------------------------- Open Inference Protocol (v2)

V2_INFER = f"/v2/models/{MODEL}/infer"


def _v2_body(session: int, t: int, steps: int, indexed: bool = True) -> dict:
    """Step t of a Triton-style sequence: ``sequence_id`` on every step, ``sequence_start``
    (with its seed) on the first, ``sequence_end`` on the last; sampled actions, so the
    seeded generator must continue exactly as well as the recurrent state."""
    parameters: dict = {"sequence_id": f"v2-{session}", "explore": True}
    if indexed:  # rlserve's step index: a step sent again is answered again, not applied twice
        parameters["step"] = t
    if t == 0:
        parameters.update(sequence_start=True, seed=2000 + session)
    if t == steps - 1:
        parameters["sequence_end"] = True
    return {"inputs": [{"name": "obs", "shape": [1, 2], "datatype": "FP32", "data": observation(session, t)}],
            "outputs": [{"name": "action"}, {"name": "dist_inputs"}], "parameters": parameters}


def _v2_step(answer: httpx.Response) -> tuple[int, list[float]]:
    assert answer.status_code == 200, answer.text
    outputs = {o["name"]: o["data"] for o in answer.json()["outputs"]}
    return outputs["action"][0], outputs["dist_inputs"]


async def test_v2_sequences_continue_across_a_killed_and_restarted_server(replicas, repository):
    """KServe v2 ``infer`` reads a sequence it does not hold from the store and continues it,
    as the JSON API does: a server killed with SIGKILL between two steps of every sequence
    and restarted (nothing cached) answers a repeated step (``parameters.step``) once more
    without moving the sequence, and the rest of each sequence exactly as an uninterrupted
    in-process server does; ``sequence_end`` ends it in the store too."""
    sessions, steps, kill_after = 24, 8, 4
    [server] = replicas(1)
    got: list[list[tuple[int, list[float]]]] = [[] for _ in range(sessions)]
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        async def step(t: int) -> None:
            answers = await asyncio.gather(*(client.post(V2_INFER, json=_v2_body(s, t, steps))
                                             for s in range(sessions)))
            for s, answer in enumerate(answers):
                got[s].append(_v2_step(answer))

        for t in range(kill_after):
            await step(t)
        server.kill()  # SIGKILL: the copies held in memory are gone
        await asyncio.to_thread(server.start)
        # The last step before the kill, sent again (as by a client whose answer was lost):
        # answered from the answer kept in the store, and the sequence does not move.
        again = await asyncio.gather(*(client.post(V2_INFER, json=_v2_body(s, kill_after - 1, steps))
                                       for s in range(sessions)))
        assert [_v2_step(answer) for answer in again] == [got[s][-1] for s in range(sessions)]
        for t in range(kill_after, steps):
            await step(t)
        # Ended by its last step, in the store as well: continuing it is refused.
        after_end = _v2_body(0, 1, steps)
        ended = await client.post(V2_INFER, json=after_end)
        assert ended.status_code == 400 and "sequence 'v2-0'" in ended.json()["error"], ended.text
        server.kill()
        await asyncio.to_thread(server.start)
        ended = await client.post(V2_INFER, json=after_end)  # a fresh process asks the store
        assert ended.status_code == 400 and "sequence 'v2-0'" in ended.json()["error"], ended.text

    from rlserve.service.app import create_app
    from rlserve.service.settings import Settings

    reference = create_app(Settings(repository=repository, max_sessions=64))
    expected: list[list[tuple[int, list[float]]]] = [[] for _ in range(sessions)]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=reference), base_url="http://ref") as client:
        for t in range(steps):
            for s in range(sessions):
                expected[s].append(_v2_step(await client.post(V2_INFER, json=_v2_body(s, t, steps))))
    assert_same_episodes(got, expected)


async def test_v2_replicas_racing_on_one_sequence_never_fork(replicas):
    """Two replicas step one sequence at once over v2: one step wins, the other is refused
    in the protocol's error shape (its 400, the message naming the sequence), never forked."""
    servers = replicas(2, RLSERVE_MAX_BATCH_DELAY_MS="50")
    racers, refused = 40, 0
    async with httpx.AsyncClient(timeout=30) as client:
        for attempt in range(3):  # a round where one replica ran late serializes: try again
            sessions = range(attempt * racers, (attempt + 1) * racers)
            started = await asyncio.gather(*(client.post(servers[0].url + V2_INFER, json=_v2_body(k, 0, 9))
                                             for k in sessions))
            assert all(r.status_code == 200 for r in started)
            # Without step indexes: the two steps race for the store's compare-and-set.
            pairs = await _race(servers, sessions, V2_INFER, lambda k, i: _v2_body(k, 1 + i, 9, indexed=False))
            for k, (a, b) in zip(sessions, pairs, strict=True):
                codes = sorted((a.status_code, b.status_code))
                assert codes in ([200, 200], [200, 400]), (k, a.text, b.text)
                for response in (a, b):
                    if response.status_code == 400:
                        refused += 1
                        message = response.json()["error"]
                        assert set(response.json()) == {"error"}
                        assert f"sequence 'v2-{k}' was changed elsewhere" in message, message
                # Both answered: they ran one after the other. Either way the store counts
                # exactly the steps that were answered.
                winners = [r for r in (a, b) if r.status_code == 200]
                info = (await client.get(servers[1].url + f"/v1/models/{MODEL}/sessions/v2-{k}")).json()
                assert info["steps"] == 1 + len(winners), (k, info)
            if refused:
                break
    assert refused > 0, "no pair overlapped in three rounds: the race was not exercised"
