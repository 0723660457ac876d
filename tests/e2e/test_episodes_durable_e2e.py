"""Multi-agent episodes in a real redis-server, served by real `rlserve serve` processes: the
episode's record lives while its agents act and goes once idle, a store that stops answering
is a 503 that changes nothing, and two replicas racing on one episode never fork it.

The set: the embedded ``cartpole-memory`` LSTM for agents ``red_*`` and the ``cartpole`` MLP
for the others. The single-agent counterparts: test_sessions_durable_e2e.py (races) and
tests/service/test_svc_session_store*.py (the TTL, a store that stalls).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import pytest_asyncio
from fleet import replica_processes
from race import race

from rlserve.service.app import DEFAULT_MODELS

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio]

SET = "team"
ACT = f"/v1/models/{SET}/agents/act"
EPISODES = f"/v1/models/{SET}/episodes/"
TTL_S = 3.0  # the idle TTL of the replica whose test waits it out
STORE_TIMEOUT_S = 0.5
WIDTH = {"red": 2, "blue": 4}  # observation widths: cartpole-memory, cartpole


@pytest.fixture(scope="module")
def policy_set(tmp_path_factory) -> Path:
    from rlserve.models.export.policy_set_export import policy_set_from_bundles
    from rlserve.models.multiagent.mapping import AgentMapping

    root = tmp_path_factory.mktemp("episodes_durable")
    (root / "repo").mkdir()
    policy_set_from_bundles({"ff": DEFAULT_MODELS / "cartpole", "rnn": DEFAULT_MODELS / "cartpole-memory"},
                            root / SET, AgentMapping({}, [("red_*", "rnn")], "ff"), name=SET)
    return root


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    from redis_server import running_redis

    with running_redis(tmp_path_factory.mktemp("episodes_redis")) as server:
        yield server


def _servers(redis, policy_set, n: int, **env: str):
    """A fixture's body: n replicas of the set sharing the store (``fleet.replica_processes``)."""
    make = replica_processes(redis.url, policy_set / "repo")
    yield next(make)(n, RLSERVE_POLICY_SETS=json.dumps([str(policy_set / SET)]), **env)
    next(make, None)  # stops them


@pytest.fixture(scope="module")
def replicas(redis, policy_set):
    """Two replicas: a 50 ms batching window (so that racing requests share batches whatever
    the machine's load) and a short store timeout."""
    yield from _servers(redis, policy_set, 2, RLSERVE_SESSION_STORE_TIMEOUT_S=str(STORE_TIMEOUT_S),
                        RLSERVE_MAX_BATCH_DELAY_MS="50")


@pytest.fixture
def short_lived(redis, policy_set):
    """One replica whose idle TTL the test waits out."""
    yield from _servers(redis, policy_set, 1, RLSERVE_SESSION_IDLE_TTL_S=str(TTL_S))


@pytest.fixture(scope="module")
def reference_app(policy_set):
    """The same set in this process, episodes in process: what one server answers."""
    from rlserve.service.app import create_app
    from rlserve.service.settings import Settings

    return create_app(Settings(repository=policy_set / "repo", policy_sets=[str(policy_set / SET)]))


@pytest_asyncio.fixture
async def reference(reference_app):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=reference_app), base_url="http://ref") as client:
        yield client


def observation(agent: str, episode: str, t: int) -> list[float]:
    rng = np.random.default_rng([sum(map(ord, f"{agent}/{episode}")), t])
    return rng.uniform(-1, 1, WIDTH[agent.split("_")[0]]).round(4).tolist()


def step(episode: str, t: int, agents: tuple[str, ...] = ("red_1", "blue_1"), **fields) -> dict:
    body = {"episode_id": episode, "agents": {a: {"observation": observation(a, episode, t)} for a in agents},
            **fields}
    if t == 0:
        body.update(episode_start=True, seed=11)
    return body


def answers(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return {agent: (a["action"], a["logp"], a.get("dist_inputs")) for agent, a in response.json()["agents"].items()}


def record_keys(redis, episode: str) -> list[bytes]:
    """The store's keys of ``episode``: its record and its agents' sessions."""
    return [key for key in redis.client().keys("*") if f":{episode}".encode() in key]


async def test_an_episode_lives_while_its_agents_act_and_is_gone_once_idle(short_lived, redis):
    """The record is written when the seats change and renewed in the background while the
    agents act (without renewal it would be gone one TTL after the start); once nobody
    acts, record and agents' state expire and the episode is unknown."""
    [server] = short_lived
    store = redis.client()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        answers(await client.post(ACT, json=step("live", 0)))
        [record] = [key for key in record_keys(redis, "live") if b":e:" in key]
        assert 0 < store.pttl(record) <= TTL_S * 1000
        started, t = time.monotonic(), 1
        while time.monotonic() - started < 1.5 * TTL_S:  # the same seats all along: no record write
            answers(await client.post(ACT, json=step("live", t)))
            t += 1
            await asyncio.sleep(TTL_S / 30)
        assert store.pttl(record) > 0, "the record of an episode whose agents act expired"
        info = await client.get(EPISODES + "live")  # read from the store (the routes always read)
        assert info.status_code == 200, info.text
        assert {agent: seat["steps"] for agent, seat in info.json()["agents"].items()} == {"red_1": t, "blue_1": t}

        deadline = time.monotonic() + 5 * TTL_S  # idle now: nothing renews it
        while record_keys(redis, "live"):
            assert time.monotonic() < deadline, f"in the store after {5 * TTL_S} s idle: {record_keys(redis, 'live')}"
            await asyncio.sleep(0.1)  # polling interval
        assert (await client.get(EPISODES + "live")).status_code in (404, 410)
        gone = await client.post(ACT, json=step("live", t))  # the episode, or its agents' state (a copy
        assert gone.status_code in (404, 410), gone.text  # held here may outlive the record by moments)
        assert gone.json()["error"]["field"] in ("episode_id", "agents.red_1", "agents.blue_1"), gone.text


async def test_a_store_that_stalls_is_503_and_the_episode_goes_on_exactly(replicas, redis, reference):
    """A redis-server that stops answering (SIGSTOP: a hung host, a partition): every request
    of the episode is refused once the store timeout passes, from either replica, and nothing is
    written; once it answers again, the same steps continue the episode as one process
    plays it (blue_1 joins in the step that stalled)."""
    bodies = [step("stall", t, ("red_1",) if t < 3 else ("red_1", "blue_1")) for t in range(6)]
    expected = [answers(await reference.post(ACT, json=body)) for body in bodies]
    a, b = replicas
    async with httpx.AsyncClient(timeout=30) as client:
        for t in range(3):
            assert answers(await client.post((a, b)[t % 2].url + ACT, json=bodies[t])) == expected[t]
        redis.process.send_signal(signal.SIGSTOP)
        try:
            for server in (a, b):  # a holds a copy of the episode, b the latest one
                for method, path, body in (("POST", ACT, bodies[3]), ("POST", ACT, bodies[2] | {"episode_start": True}),
                                           ("GET", EPISODES + "stall", None),
                                           ("POST", EPISODES.rstrip("/"), {"episode_id": "x"})):
                    r = await asyncio.wait_for(client.request(method, server.url + path, json=body), 30)
                    assert r.status_code == 503, (method, path, r.text)
                    assert r.json()["error"]["code"] == "session_store_unavailable" and r.headers["retry-after"] == "1"
        finally:
            redis.process.send_signal(signal.SIGCONT)
        for t in range(3, 6):
            assert answers(await client.post((b, a)[t % 2].url + ACT, json=bodies[t])) == expected[t], t
    assert (await reference.get(EPISODES + "stall")).json()["steps"] == 6


# Known failures of the current code (seen on it and on the code before the session lifecycle
# change, bebd110); the fix belongs to the episode plan and the stores, not to this test. Not
# strict: whether a round shows one depends on how the replicas' batches interleave.
RACES_FORK = pytest.mark.xfail(strict=False, reason=(
    "replicas racing on one episode: a 409'd request's agents of another policy stay stepped (its parts "
    "commit per policy), a racing step can be told a live agent's session is unknown (404), and a step "
    "following the other replica's can be a 409 with no concurrent writer"))


@pytest.mark.parametrize("joiner", [pytest.param("red_2", marks=RACES_FORK), pytest.param("blue_1", marks=RACES_FORK)])
async def test_two_replicas_racing_on_one_episode_never_fork_it(replicas, reference, joiner):
    """Each episode's next step, red_1's and the first of ``joiner`` (of red_1's policy, or
    of the other), sent to both replicas within a millisecond (both hold a copy of the
    episode without ``joiner``). Either both are answered, one after the other, or one is
    refused with a 409; ``joiner`` is seated once, and the agents' stored state is the start
    followed by exactly the steps answered, in one order."""
    racers, conflicts = 30, 0
    a, b = replicas
    async with httpx.AsyncClient(timeout=30) as client:
        for attempt in range(3):  # a round where one replica ran late serializes: try again
            episodes = [f"race{attempt}-{k}" for k in range(racers)]
            for which, t in ((a, 0), (b, 1)):  # both replicas hold a copy (red_1 alone)
                for r in await asyncio.gather(*(client.post(which.url + ACT, json=step(e, t, ("red_1",)))
                                                for e in episodes)):
                    answers(r)
            pairs = await race(replicas, range(racers), ACT, lambda k, i, ids=episodes: _racing(ids[k], i, joiner))
            for episode, (first, second) in zip(episodes, pairs, strict=True):
                codes = sorted((first.status_code, second.status_code))
                assert codes in ([200, 200], [200, 409]), (episode, first.text, second.text)
                conflicts += codes == [200, 409]
                for response in (first, second):
                    if response.status_code == 409:
                        assert response.json()["error"]["code"] == "session_conflict", response.text
            await asyncio.gather(*(_assert_linear(client, replicas, reference, episode, joiner, first, second)
                                   for episode, (first, second) in zip(episodes, pairs, strict=True)))
            if conflicts:
                break
    assert conflicts > 0, "no pair overlapped in three rounds: the race was not exercised"


def _racing(episode: str, replica: int, joiner: str) -> dict:
    return step(episode, 2 + replica, ("red_1", joiner), explore=False, outputs=["dist_inputs"])


async def _assert_linear(client, replicas, reference, episode: str, joiner: str, first, second) -> None:
    winners = [(i, r.json()) for i, r in enumerate((first, second)) if r.status_code == 200]
    info = (await client.get(replicas[1].url + EPISODES + episode)).json()
    steps = {agent: seat["steps"] for agent, seat in info["agents"].items()}
    assert steps == {"red_1": 2 + len(winners), joiner: len(winners)}, (episode, steps)  # seated once
    probe = step(episode, 9, ("red_1", joiner), explore=False, outputs=["dist_inputs"])
    stored_next = (await client.post(replicas[0].url + ACT, json=probe)).json()["agents"]
    for order in ([winners] if len(winners) == 1 else [winners, winners[::-1]]):
        replay = await _replay(reference, episode, [_racing(episode, i, joiner) for i, _ in order], probe)
        if all(_close(got["agents"], expected) for (_, got), expected in zip(order, replay, strict=False)) \
                and _close(stored_next, replay[-1]):
            return
    raise AssertionError(f"{episode}: the stored state is no linear history of the answered steps {winners}")


async def _replay(reference, episode: str, winners: list[dict], probe: dict) -> list[dict]:
    """The episode's steps on the reference (a fresh id each time): start, the step on the
    second replica, the ``winners`` in order, the probe; the answers after the first two."""
    replay_id = f"{episode}-{time.monotonic_ns()}"

    def renamed(body: dict) -> dict:
        return {**body, "episode_id": replay_id}

    for body in (step(episode, 0, ("red_1",)), step(episode, 1, ("red_1",))):
        answers(await reference.post(ACT, json=renamed(body)))
    out = []
    for body in [*winners, probe]:
        response = await reference.post(ACT, json=renamed(body))
        assert response.status_code == 200, response.text
        out.append(response.json()["agents"])
    return out


def _close(got: dict, expected: dict) -> bool:
    return set(got) == set(expected) and all(
        np.allclose(got[agent]["dist_inputs"], expected[agent]["dist_inputs"], rtol=1e-4, atol=1e-4)
        for agent in got)
