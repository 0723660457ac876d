"""Sessions of the Open Inference Protocol (v2 ``infer`` with ``sequence_id``) across a
killed server and racing replicas: real redis-server, real ``rlserve serve`` processes
(the JSON API's counterparts are in test_sessions_durable_e2e.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from fleet import MODEL, assert_same_episodes, model_repository, observation, replica_processes
from race import race

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio]


@pytest.fixture
def repository(tmp_path) -> Path:
    return model_repository(tmp_path)


@pytest.fixture
def replicas(redis_server, repository):
    """``replicas(n, **env)``: n server processes sharing the redis-server and the repository."""
    yield from replica_processes(redis_server.url, repository)


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
            pairs = await race(servers, sessions, V2_INFER, lambda k, i: _v2_body(k, 1 + i, 9, indexed=False))
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
