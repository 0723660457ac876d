"""Sessions in a real redis-server, served by in-process apps (each app one "replica").

What is checked: every session field survives in the store (state, previous actions and
rewards, step count, seeded generator), replicas share sessions (alternating steps equal
an in-process reference bit for bit), a stale copy never writes (409, then the retry
reads the store), batches validate and commit (script or watched transaction) without
losing a step, and creations and ends are seen by every replica. Retried steps,
export/import and a store that does not answer: test_svc_session_store_requests.py.
"""

from __future__ import annotations

import asyncio
import hashlib

import pytest
from conftest import error_of
from svc_session_steps import episode, observations, step, two_replicas_partway

from rlserve.service.sessions.redis_scripts import COMMIT_LUA, VALIDATE_LUA

pytestmark = pytest.mark.asyncio

MODELS = ("lstm", "gtrxl")


def cache_count(app, result: str) -> float:
    for line in app.state.metrics.render().decode().splitlines():
        if line.startswith(f'rlserve_session_cache_total{{result="{result}"}}'):
            return float(line.split()[-1])
    return 0.0


async def pipelined(app, client, sid: str, first: dict, second: dict) -> list:
    """Post ``first`` and, while it is still queued, ``second`` for session ``sid`` (one
    client pipelining its steps); both answers. Fails unless both were in flight at once."""
    held = app.state.registry.entry("lstm").policy().sessions

    async def in_flight(count: int) -> None:
        for _ in range(2000):
            session = held.live(sid)
            if session is not None and session.inflight >= count:
                return
            await asyncio.sleep(0.0005)
        raise AssertionError(f"session {sid!r} never had {count} requests in flight")

    body = {"session_id": sid}
    one = asyncio.ensure_future(client.post("/v1/models/lstm/act", json={**body, **first}))
    await in_flight(1)
    two = asyncio.ensure_future(client.post("/v1/models/lstm/act", json={**body, **second}))
    await in_flight(2)
    answers = await asyncio.gather(one, two)
    for r in answers:
        assert r.status_code == 200, r.text
    return [r.json()["action"] for r in answers]


@pytest.mark.parametrize("model", MODELS)
async def test_replicas_alternating_equal_one_process(make_client, redis_server, model):
    store = {"session_store": redis_server.url}
    _, a = make_client((model,), **store)
    _, b = make_client((model,), **store)
    _, reference = make_client((model,))
    for k in range(3):
        obs = observations(k, 8)
        expected = await episode([reference], model, f"s{k}", obs, outputs=["value"])
        assert await episode([a, b], model, f"s{k}", obs, outputs=["value"]) == expected
    info = (await b.get(f"/v1/models/{model}/sessions/s0")).json()
    assert info["steps"] == 8 and info["seed"] == 17


async def test_a_restarted_replica_continues_from_the_store(make_client, redis_server):
    store = {"session_store": redis_server.url}
    _, reference = make_client(("lstm",))
    obs = observations(5, 10)
    expected = await episode([reference], "lstm", "r", obs)
    _, before = make_client(("lstm",), **store)
    assert await episode([before], "lstm", "r", obs[:6]) == expected[:6]
    app, after = make_client(("lstm",), **store)  # a new process: nothing cached
    for t in range(6, 10):
        r = await step(after, "lstm", "r", obs[t], t)
        assert r.json()["action"] == expected[t]
    text = app.state.metrics.render().decode()
    assert 'rlserve_session_cache_total{result="miss"} 1.0' in text
    assert 'rlserve_session_cache_total{result="hit"} 3.0' in text


async def test_a_store_that_lost_its_scripts_loads_them_again(make_client, redis_server):
    """Batches call their scripts by SHA; after SCRIPT FLUSH (what a Redis restart or
    failover does to them) the next batch loads them again and the episode goes on."""
    a, b, obs, expected = await two_replicas_partway(make_client, {"session_store": redis_server.url}, 6, "f")
    redis = redis_server.client()
    shas = [hashlib.sha1(script.encode()).hexdigest() for script in (COMMIT_LUA, VALIDATE_LUA)]
    assert redis.script_exists(*shas) == [True, True]
    redis.script_flush()
    assert redis.script_exists(*shas) == [False, False]
    for t in range(3, 6):  # alternating: every validate finds a stale copy
        r = await step([a, b][t % 2], "lstm", "f", obs[t], t)
        assert r.status_code == 200, r.text
        assert r.json()["action"] == expected[t]
    assert redis.script_exists(*shas) == [False, True]  # held sessions commit in a transaction
    # A session new to the store is written by the commit script (it checks the key is absent).
    assert (await step(a, "lstm", "g", obs[0], 0)).status_code == 200
    assert redis.script_exists(*shas) == [True, True]


async def test_the_store_holds_a_ttl_and_a_compact_record(make_client, redis_server):
    _, client = make_client(("lstm",), session_store=redis_server.url, session_idle_ttl_s=30)
    assert (await step(client, "lstm", "ttl", observations(1, 1)[0], 0)).status_code == 200
    redis = redis_server.client()
    [key] = redis.keys("rlserve:s:*")
    assert key == b"rlserve:s:4:lstm:ttl"
    assert 25_000 < redis.pttl(key) <= 30_000
    # 80-byte header, version "1", h and c of 8 float32 each, one prev action (2) and reward.
    assert redis.strlen(key) == 80 + 1 + 4 * (8 + 8 + 2 + 1)


async def test_a_stale_copy_never_writes(make_client, redis_server):
    """trust mode skips the read before each batch; the write still refuses a stale copy."""
    store = {"session_store": redis_server.url, "session_cache": "trust"}
    app_a, a = make_client(("lstm",), **store)
    _, b = make_client(("lstm",), **store)
    _, reference = make_client(("lstm",))
    obs = observations(7, 4)
    expected = await episode([reference], "lstm", "t", obs)
    assert (await step(a, "lstm", "t", obs[0], 0)).json()["action"] == expected[0]
    assert (await step(b, "lstm", "t", obs[1], 1)).json()["action"] == expected[1]
    stale = await step(a, "lstm", "t", obs[2], 2)  # a still holds the copy after step 0
    assert stale.status_code == 409
    error = error_of(stale)
    assert error["code"] == "session_conflict" and "'t'" in error["message"] and "retry" in error["message"]
    retried = await step(a, "lstm", "t", obs[2], 2)  # the stale copy was dropped: read again
    assert retried.json()["action"] == expected[2]
    assert (await step(b, "lstm", "t", obs[3], 3)).status_code == 409  # now b's copy is the stale one
    assert (await step(b, "lstm", "t", obs[3], 3)).json()["action"] == expected[3]
    assert "rlserve_session_conflicts_total 1.0" in app_a.state.metrics.render().decode()


async def test_steps_of_held_sessions_commit_in_a_watched_transaction(make_client, redis_server):
    """After its validate a batch writes with MULTI/MSET/EXEC under the validate's WATCH,
    never through the commit script; a batch with a session new to the store uses the
    script (it checks the key is absent), as does one whose validate did not run."""
    _, client = make_client(("lstm",), session_store=redis_server.url, session_idle_ttl_s=30)
    redis = redis_server.client()
    obs = observations(11, 5)

    def calls() -> dict[str, int]:
        return {name[len("cmdstat_"):]: stats["calls"] for name, stats in redis.info("commandstats").items()}

    redis.config_resetstat()
    await episode([client], "lstm", "x", obs[:2])
    # Step 0 creates the session: its commit is the script, loaded on first use. Step 1's
    # validate, sent before its batch runs, finds its script missing too: loaded, then
    # watched and validated again.
    assert calls()["watch"] == 2 and calls()["script|load"] == 2 and "mset" in calls()
    redis.config_resetstat()
    for t in range(2, 5):
        assert (await step(client, "lstm", "x", obs[t], t)).status_code == 200
    stats = calls()
    # Three steps: three validates (WATCH + the validate script), three transactions.
    assert {stats.get(c, 0) for c in ("watch", "evalsha", "multi", "mset", "eval", "exec")} == {3}
    key = b"rlserve:s:4:lstm:x"
    assert 25_000 < redis.pttl(key) <= 30_000  # the transaction set the TTL with the record
    assert (await client.get("/v1/models/lstm/sessions/x")).json()["steps"] == 5


async def test_a_write_between_validate_and_commit_loses_only_its_request(make_client, redis_server):
    """Replica b steps session w while a batch of a, holding w and v, is between its
    validate and its commit: a's transaction is refused (w changed under its WATCH), the
    commit script then writes v's step and answers w's with 409, and both episodes go on
    exactly as in one process."""
    store = {"session_store": redis_server.url}
    app_a, a = make_client(("lstm",), max_batch_delay_ms=200, **store)
    _, b = make_client(("lstm",), **store)
    _, reference = make_client(("lstm",))
    obs_w, obs_v = observations(21, 4), observations(22, 4)
    expected_w = await episode([reference], "lstm", "w", obs_w)
    expected_v = await episode([reference], "lstm", "v", obs_v)
    for t in range(2):  # both sessions held by a, current
        assert (await step(a, "lstm", "w", obs_w[t], t)).json()["action"] == expected_w[t]
        assert (await step(a, "lstm", "v", obs_v[t], t)).json()["action"] == expected_v[t]
    sessions = app_a.state.registry.entry("lstm").policy().sessions
    commit = sessions.commit
    seen = []

    async def commit_after_b_stepped_w(groups):
        sessions.commit = commit
        seen.append(sorted(s.id for group in groups for s in group))
        r = await step(b, "lstm", "w", obs_w[2], 2)
        assert r.json()["action"] == expected_w[2]
        return await commit(groups)

    transact, exec_answers = sessions.remote.store.transact, []

    async def transact_seen(*args, **kwargs):
        written = await transact(*args, **kwargs)
        exec_answers.append(written)
        return written

    sessions.commit = commit_after_b_stepped_w
    sessions.remote.store.transact = transact_seen
    w, v = await asyncio.gather(step(a, "lstm", "w", obs_w[2], 2), step(a, "lstm", "v", obs_v[2], 2))
    assert seen == [["v", "w"]]  # one batch held both
    assert exec_answers == [False]  # its transaction was tried, and Redis refused it
    assert w.status_code == 409 and error_of(w)["code"] == "session_conflict"
    assert v.status_code == 200 and v.json()["action"] == expected_v[2]
    assert "rlserve_session_conflicts_total 1.0" in app_a.state.metrics.render().decode()
    assert (await step(a, "lstm", "w", obs_w[3], 3)).json()["action"] == expected_w[3]  # a reads w again
    assert (await step(b, "lstm", "v", obs_v[3], 3)).json()["action"] == expected_v[3]


@pytest.mark.parametrize("seed", [None, 5])
async def test_a_new_episode_on_a_stale_copy_equals_one_process(make_client, redis_server, seed):
    """A replica whose copy is stale runs its batch before the store's answer arrives, then
    restores the session from the store and runs the request again; an episode restart
    (reseeded or keeping the session's generator) is redone on the restored session."""
    store = {"session_store": redis_server.url}
    app_a, a = make_client(("lstm",), **store)
    _, b = make_client(("lstm",), **store)
    _, reference = make_client(("lstm",))
    obs = observations(31, 7)
    restart = {"episode_start": True} if seed is None else {"episode_start": True, "seed": seed}
    runs = []
    for clients in ([reference], [a, b]):
        actions = await episode(clients, "lstm", "n", obs[:4])  # a, b, a, b: a's copy is stale now
        misses = cache_count(app_a, "miss")
        for t in range(4, 7):  # a new episode, its first step on a
            body = {"observation": obs[t], "session_id": "n", **(restart if t == 4 else {"reward": 1.0})}
            r = await clients[t % len(clients)].post("/v1/models/lstm/act", json=body)
            assert r.status_code == 200, r.text
            actions.append(r.json()["action"])
        runs.append(actions)
        if clients[0] is a:  # a's two steps found their copy stale after the batch ran, and ran again
            assert cache_count(app_a, "miss") == misses + 2
    assert runs[0] == runs[1]
    info = (await b.get("/v1/models/lstm/sessions/n")).json()
    assert info["steps"] == 3 and info["seed"] == (17 if seed is None else seed)


@pytest.mark.parametrize("second", ["step", "reseeded restart", "restart"])
@pytest.mark.parametrize("external", [False, True])
async def test_pipelined_steps_of_one_session_equal_sequential_ones(make_client, redis_server, external, second):
    """A client sends step t and, before its answer, step t+1 (or a new episode). The
    second applies after the first, as if sent after its answer: the first draws from the
    session's generator as it was, a restart counts from 0 afterwards. With the external
    store the replica's copy is stale, so the first step's batch runs again on the store's
    record (see ``test_a_new_episode_on_a_stale_copy_equals_one_process``), and the second
    still draws from the restored generator."""
    store = {"session_store": redis_server.url} if external else {}
    app_a, a = make_client(("lstm",), max_batch_delay_ms=100, **store)
    _, b = make_client(("lstm",), **store)
    _, reference = make_client(("lstm",))
    obs = observations(41, 7)
    follow = {"reward": 1.0}
    if second != "step":
        follow = {"episode_start": True, **({"seed": 5} if second == "reseeded restart" else {})}
    bodies = [{"observation": obs[4], "reward": 2.0}, {"observation": obs[5], **follow}]
    runs, steps = [], []
    for clients in ([reference], [a, b] if external else [a]):
        actions = await episode(clients, "lstm", "p", obs[:4])  # a, b, a, b: a's copy is stale now
        if clients[0] is a:
            misses = cache_count(app_a, "miss")
            actions += await pipelined(app_a, a, "p", *bodies)
            if external:  # the first step's batch found the stale copy and ran again
                assert cache_count(app_a, "miss") == misses + 1
        else:
            for body in bodies:
                r = await reference.post("/v1/models/lstm/act", json={"session_id": "p", **body})
                actions.append(r.json()["action"])
        r = await clients[-1].post("/v1/models/lstm/act", json={"session_id": "p", "observation": obs[6]})
        actions.append(r.json()["action"])
        runs.append(actions)
        steps.append((await clients[-1].get("/v1/models/lstm/sessions/p")).json())
    assert runs[0] == runs[1]
    assert steps[0]["steps"] == steps[1]["steps"] == (7 if second == "step" else 2)
    assert steps[0]["seed"] == steps[1]["seed"] == (5 if second == "reseeded restart" else 17)


async def test_a_new_session_next_to_held_ones_commits_with_the_script(make_client, redis_server):
    """A batch holding a session new to the store next to a held one cannot commit with a
    transaction (the new key must be checked absent): it ends the WATCH and runs the commit
    script, both on the watching connection; both episodes go on exactly."""
    _, client = make_client(("lstm",), max_batch_delay_ms=100, session_store=redis_server.url)
    _, reference = make_client(("lstm",))
    redis = redis_server.client()
    obs_h, obs_n = observations(51, 3), observations(52, 2)
    expected_h = await episode([reference], "lstm", "h", obs_h)
    expected_n = await episode([reference], "lstm", "n", obs_n)
    assert await episode([client], "lstm", "h", obs_h[:2]) == expected_h[:2]
    redis.config_resetstat()
    h, n = await asyncio.gather(step(client, "lstm", "h", obs_h[2], 2), step(client, "lstm", "n", obs_n[0], 0))
    assert h.json()["action"] == expected_h[2] and n.json()["action"] == expected_n[0]
    stats = {name[len("cmdstat_"):]: v["calls"] for name, v in redis.info("commandstats").items()}
    assert stats.get("multi", 0) == stats.get("exec", 0) == 0  # no transaction
    assert stats["watch"] == stats["unwatch"] == 1 and stats["evalsha"] == 2  # validate, commit
    assert (await step(client, "lstm", "n", obs_n[1], 1)).json()["action"] == expected_n[1]


async def test_a_batch_that_failed_on_a_stale_copy_is_not_run_again(make_client, redis_server):
    """The runtime fails on a batch that ran on a stale copy: the request gets the failure
    (not a second run of a poisoned batch), the copy is dropped, and the retry continues
    the episode from the store exactly."""
    store = {"session_store": redis_server.url}
    _, reference = make_client(("lstm",))
    obs = observations(8, 6)
    expected = await episode([reference], "lstm", "q", obs)
    app_a, a = make_client(("lstm",), **store)
    _, b = make_client(("lstm",), **store)
    assert await episode([a, b], "lstm", "q", obs[:4]) == expected[:4]
    batcher = app_a.state.registry.entry("lstm").policy().batcher
    run_batch, calls = batcher._run_batch, []

    def fails_once(steps):
        calls.append(len(steps))
        if len(calls) == 1:
            raise RuntimeError("the accelerator fell over")
        return run_batch(steps)

    batcher._run_batch = fails_once
    r = await step(a, "lstm", "q", obs[4], 4)  # a's copy is from step 2: stale
    assert r.status_code == 500 and error_of(r)["code"] == "batch_failed"
    assert calls == [1]
    r = await step(a, "lstm", "q", obs[4], 4)
    assert r.status_code == 200 and r.json()["action"] == expected[4]
    assert (await step(b, "lstm", "q", obs[5], 5)).json()["action"] == expected[5]


async def test_an_unload_inside_a_batch_gives_the_watching_connection_back(make_client, redis_server):
    """Unloading a model while its batch waits between the validate (which holds a
    connection with a WATCH) and the commit: the request gets a 503 and the connection
    goes back to the pool rather than leaking with the unloaded version."""
    app, client = make_client(("lstm",), session_store=redis_server.url)
    obs = observations(13, 3)
    await episode([client], "lstm", "z", obs[:2])
    policy = app.state.registry.entry("lstm").policy()
    sessions = policy.sessions
    commit, waiting = sessions.commit, asyncio.Event()

    async def stuck(groups):
        waiting.set()
        await asyncio.Event().wait()  # never: the unload cancels it
        return await commit(groups)

    sessions.commit = stuck
    pending = asyncio.ensure_future(step(client, "lstm", "z", obs[2], 2))
    await asyncio.wait_for(waiting.wait(), 10)
    pool = sessions.remote.store.client().connection_pool
    assert len(pool._in_use_connections) == 1  # the batch's WATCH
    await app.state.registry.remove("lstm")
    r = await pending
    assert r.status_code == 503
    assert not pool._in_use_connections


async def test_two_creations_of_one_id_cannot_both_win(make_client, redis_server):
    store = {"session_store": redis_server.url}
    _, a = make_client(("lstm",), **store)
    _, b = make_client(("lstm",), **store)
    assert (await a.post("/v1/models/lstm/sessions", json={"session_id": "c"})).status_code == 201
    r = await b.post("/v1/models/lstm/sessions", json={"session_id": "c"})
    assert r.status_code == 409 and error_of(r)["code"] == "session_conflict"
    # episode_start on b restarts the existing session instead (it reads it first).
    assert (await step(b, "lstm", "c", observations(2, 1)[0], 0)).status_code == 200
    assert (await a.get("/v1/models/lstm/sessions/c")).json()["steps"] == 1


async def test_end_on_one_replica_is_410_on_the_other(make_client, redis_server):
    store = {"session_store": redis_server.url}
    _, a = make_client(("lstm",), **store)
    _, b = make_client(("lstm",), **store)
    obs = observations(3, 3)
    await episode([a, b], "lstm", "e", obs[:2])
    assert (await a.delete("/v1/models/lstm/sessions/e")).status_code == 200
    r = await step(b, "lstm", "e", obs[2], 2)  # b holds a copy: the read before the batch says it is gone
    assert r.status_code == 410 and error_of(r)["code"] == "session_expired"
    _, c = make_client(("lstm",), **store)  # a replica that never held it: the tombstone says why
    r = await step(c, "lstm", "e", obs[2], 2)
    assert r.status_code == 410 and "ended by the client" in error_of(r)["message"]
    assert (await c.get("/v1/models/lstm/sessions/never")).status_code == 404
