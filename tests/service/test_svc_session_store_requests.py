"""Requests around sessions in a real redis-server, served by in-process apps: retried steps
are answered from the kept answer (the step index), export/import moves a session between
stores, several workers need a store for sessions, and a store that does not answer is a
503 for the requests of sessions only, not a guess.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time

import pytest
from conftest import error_of
from svc_session_steps import episode, forge_answer, observations, step, two_replicas_partway

pytestmark = pytest.mark.asyncio


async def test_requests_without_sessions_need_no_store(make_client, redis_server):
    """With the store down, a batch mixing a session's step and a stateless request
    answers the stateless one; only the session's step is a 503."""
    app, client = make_client(("lstm",), max_batch_delay_ms=100, session_store=redis_server.unix_url,
                              session_store_timeout_s=0.5)
    obs = observations(12, 3)
    await episode([client], "lstm", "u", obs[:2])
    redis_server.process.kill()
    redis_server.process.wait()
    stateful, stateless = await asyncio.gather(
        step(client, "lstm", "u", obs[2], 2), client.post("/v1/models/lstm/act", json={"observation": obs[2]}))
    assert stateful.status_code == 503 and error_of(stateful)["code"] == "session_store_unavailable"
    assert stateless.status_code == 200


@pytest.mark.parametrize("external", [False, True])
async def test_a_retried_step_is_answered_again(make_client, redis_server, external):
    settings = {"session_store": redis_server.url} if external else {}
    _, a = make_client(("lstm",), **settings)
    obs = observations(9, 3)
    first = await step(a, "lstm", "i", obs[0], 0, step=0)
    second = await step(a, "lstm", "i", obs[1], 1, step=1, outputs=["value", "raw_action"])
    assert second.status_code == 200 and "raw_action" in second.json()
    again = await step(a, "lstm", "i", obs[1], 1, step=1, outputs=["value", "raw_action"])
    assert again.json() == second.json() and first.json() != second.json()
    ahead = await step(a, "lstm", "i", obs[2], 2, step=5)
    assert ahead.status_code == 409 and error_of(ahead)["field"] == "step"
    assert error_of(ahead)["expected"] == 2 and error_of(ahead)["received"] == 5
    # The session did not move on the repeat: step 2 is the same as without the retry.
    _, reference = make_client(("lstm",))
    expected = await episode([reference], "lstm", "i", obs)
    assert (await step(a, "lstm", "i", obs[2], 2, step=2)).json()["action"] == expected[2]
    if external:  # the kept answer lives in the store: another replica answers the retry too
        _, b = make_client(("lstm",), **settings)
        repeat = await step(b, "lstm", "i", obs[2], 2, step=2)
        assert repeat.json()["action"] == expected[2]
        assert (await b.get("/v1/models/lstm/sessions/i")).json()["steps"] == 3


async def test_step_index_refusals(make_client):
    _, client = make_client(("lstm",))
    r = await client.post("/v1/models/lstm/act", json={"observation": [0, 0, 0, 0], "step": 0})
    assert r.status_code == 400 and error_of(r)["field"] == "step"
    r = await client.post("/v1/models/lstm/act", json={"observation": [0, 0, 0, 0], "session_id": "x",
                                                       "episode_start": True, "step": 3})
    assert r.status_code == 400 and error_of(r)["expected"] == 0
    r = await client.post("/v1/models/lstm/act", json={"observations": [[0, 0, 0, 0]], "session_ids": ["x"],
                                                       "step": 0})
    assert r.status_code == 400 and error_of(r)["field"] == "step"
    # JSON Schema's integer: 1.0 is the integer 1 (the documented type), 1.5 is not.
    obs = observations(5, 2)
    assert (await step(client, "lstm", "f", obs[0], 0, step=0.0)).status_code == 200
    r = await step(client, "lstm", "f", obs[1], 1, step=1.5)
    assert r.status_code == 400 and error_of(r)["field"] == "step" and error_of(r)["received"] == 1.5
    assert (await step(client, "lstm", "f", obs[1], 1, step=1.0)).status_code == 200
    assert (await client.get("/v1/models/lstm/sessions/f")).json()["steps"] == 2


@pytest.mark.parametrize("source_external", [False, True])
async def test_export_import_moves_a_session(make_client, redis_server, source_external):
    source_settings = {"session_store": redis_server.url} if source_external else {}
    target_settings = {} if source_external else {"session_store": redis_server.url}
    _, source = make_client(("lstm",), **source_settings)
    _, target = make_client(("lstm",), **target_settings)
    _, reference = make_client(("lstm",))
    obs = observations(11, 7)
    expected = await episode([reference], "lstm", "m", obs)
    assert await episode([source], "lstm", "m", obs[:4]) == expected[:4]
    exported = await source.get("/v1/models/lstm/sessions/m", headers={"accept": "application/octet-stream"})
    assert exported.headers["content-type"] == "application/octet-stream"
    put = await target.put("/v1/models/lstm/sessions/moved", content=exported.content,
                           headers={"content-type": "application/octet-stream"})
    assert put.status_code == 200 and put.json()["steps"] == 4 and put.json()["seed"] == 17
    for t in range(4, 7):
        assert (await step(target, "lstm", "moved", obs[t], t)).json()["action"] == expected[t]


async def test_import_refuses_what_does_not_fit(make_client):
    _, client = make_client(("lstm", "gtrxl"))
    await step(client, "gtrxl", "g", observations(1, 1)[0], 0)
    exported = (await client.get("/v1/models/gtrxl/sessions/g", headers={"accept": "application/octet-stream"})).content
    octet = {"content-type": "application/octet-stream"}
    r = await client.put("/v1/models/lstm/sessions/x", content=exported, headers=octet)
    assert r.status_code == 422 and error_of(r)["field"] == "body" and "tensors" in error_of(r)["expected"]
    r = await client.put("/v1/models/lstm/sessions/x", content=b"not a record", headers=octet)
    assert r.status_code == 422 and error_of(r)["field"] == "body"
    r = await client.put("/v1/models/lstm/sessions/x", content=exported, headers={"content-type": "text/plain"})
    assert r.status_code == 400 and error_of(r)["field"] == "Content-Type"
    r = await client.put("/v1/models/gtrxl/sessions/x?version=9", content=exported, headers=octet)
    assert r.status_code == 404 and error_of(r)["code"] == "model_not_found"
    assert (await client.get("/v1/models/lstm/sessions/x")).status_code == 404  # nothing was created


async def test_several_workers_without_a_store_refuse_sessions(make_client):
    _, client = make_client(("lstm",), workers=2)
    r = await client.post("/v1/models/lstm/sessions", json={})
    assert r.status_code == 503 and error_of(r)["code"] == "sessions_unavailable"
    assert "RLSERVE_SESSION_STORE" in error_of(r)["message"]
    r = await step(client, "lstm", "w", [0.1, 0.2, 0.3, 0.4], 0)
    assert r.status_code == 503 and "RLSERVE_SESSION_STORE" in error_of(r)["message"]
    r = await client.post("/v1/models/lstm/act", json={"observation": [0.1, 0.2, 0.3, 0.4]})
    assert r.status_code == 200


async def test_a_store_that_does_not_answer_is_503(make_client, redis_server, caplog):
    """The client learns that the store did not answer, not where it is; the log says where."""
    _, client = make_client(("lstm",), session_store=redis_server.unix_url, session_store_timeout_s=0.5)
    obs = observations(4, 3)
    await episode([client], "lstm", "d", obs[:2])  # over the unix socket
    redis_server.process.kill()
    redis_server.process.wait()
    with caplog.at_level(logging.WARNING, logger="rlserve.sessions.redis"):
        r = await step(client, "lstm", "d", obs[2], 2)
    assert r.status_code == 503 and error_of(r)["code"] == "session_store_unavailable"
    # The client is told what happened, not where the store is: the log says that.
    socket_path = redis_server.unix_url.removeprefix("unix://")
    assert r.headers["retry-after"] == "1" and "redis.sock" not in r.text and socket_path not in r.text
    assert any(socket_path in record.getMessage() for record in caplog.records), caplog.text
    r = await client.post("/v1/models/lstm/act", json={"observation": obs[2]})
    assert r.status_code == 200  # stateless requests need no store


async def test_a_store_that_stalls_is_503_after_its_timeout_and_the_episode_goes_on(make_client, redis_server):
    """A redis-server that stops answering without closing its sockets (SIGSTOP: a hung
    host, a long fork, a network partition) is refused once the store timeout passes, not
    waited on forever; once it answers again the same step, sent again, continues the
    episode exactly (nothing was written while it stalled)."""
    timeout_s = 0.5
    store = {"session_store": redis_server.unix_url, "session_store_timeout_s": timeout_s}
    a, b, obs, expected = await two_replicas_partway(make_client, store, 7, "h")
    redis_server.process.send_signal(signal.SIGSTOP)
    try:
        for client in (a, b):  # both hold a copy (a the latest, b a stale one): their validate stalls
            started = time.monotonic()
            # Not waited on forever: answered while the store still stalls (a hang would run
            # into wait_for's bound; the stall lasts until after both answers).
            r = await asyncio.wait_for(step(client, "lstm", "h", obs[3], 3), 30)
            waited = time.monotonic() - started
            assert r.status_code == 503 and error_of(r)["code"] == "session_store_unavailable", r.text
            assert r.headers["retry-after"] == "1"
            assert waited >= timeout_s * 0.9, waited  # it did wait for the store, its timeout long
    finally:
        redis_server.process.send_signal(signal.SIGCONT)
    for t in range(3, 6):
        r = await step([b, a][t % 2], "lstm", "h", obs[t], t)
        assert r.status_code == 200, r.text
        assert r.json()["action"] == expected[t]


@pytest.mark.parametrize("external", [False, True])
async def test_an_ended_session_id_starts_a_new_episode(make_client, redis_server, external):
    """A session ended here (DELETE) is gone for steps, and ``episode_start`` with its id
    starts a new episode: with the same seed, the same actions as the first."""
    settings = {"session_store": redis_server.url} if external else {}
    _, client = make_client(("lstm",), **settings)
    obs = observations(21, 3)
    first = await episode([client], "lstm", "again", obs)
    assert (await client.delete("/v1/models/lstm/sessions/again")).status_code == 200
    assert (await step(client, "lstm", "again", obs[1], 1)).status_code == 410
    assert await episode([client], "lstm", "again", obs) == first


@pytest.mark.parametrize("junk", [b"\xff", b"\x91\xa1x", b"\x93\x00\x01\x02"], ids=["not-msgpack", "str", "short"])
async def test_an_imported_kept_answer_that_is_none_is_not_replayed(make_client, junk):
    """A session imported with bytes in its kept answer's place that are no kept answer:
    a retry of its last step is a 409 (the answer is not there), not an error of the batch."""
    _, client = make_client(("lstm",))
    obs = observations(4, 2)
    assert (await step(client, "lstm", "k", obs[0], 0, step=0)).status_code == 200
    exported = (await client.get("/v1/models/lstm/sessions/k", headers={"accept": "application/octet-stream"})).content
    answer_len = int.from_bytes(exported[36:40], "little")
    assert answer_len >= len(junk)
    end = len(exported) - int.from_bytes(exported[76:80], "little")  # the kept answer ends where the trail starts
    forged = exported[:end - answer_len] + junk.ljust(answer_len, b"\xc0") + exported[end:]
    octet = {"content-type": "application/octet-stream"}
    assert (await client.put("/v1/models/lstm/sessions/k2", content=forged, headers=octet)).status_code == 200
    retry = await step(client, "lstm", "k2", obs[0], 1, step=0)
    assert retry.status_code == 409 and error_of(retry)["field"] == "step"
    assert (await step(client, "lstm", "k2", obs[1], 1, step=1)).status_code == 200


@pytest.mark.parametrize("answer", [
    [0, "junk", -1.0, None, None, None],  # no action of Box(2)
    [0, "", 0.5, None, None, None],
    [0, [0.1, 0.2, 0.3], 0.5, None, None, None],  # three floats for two
    [0, [0.1, 0.2], "x", None, None, None],  # logp no number
    [0, [0.1, 0.2], 0.5, [1.0], None, None],  # value no number
    [0, [0.1, 0.2], 0.5, None, None, ["a", "b", "c", "d"]],  # dist_inputs no numbers
    [0, [0.1, 0.2], 0.5, None, None, [0.1, 0.2]],  # two dist_inputs of the four
    [0, [0.1, 0.2], 0.5, None, None, [[0.1, 0.2, 0.3, 0.4]]],
], ids=["string-action", "empty-string", "wrong-width", "logp", "value", "dist-inputs", "dist-width", "dist-nested"])
@pytest.mark.parametrize("unsquash", [False, True])
async def test_an_imported_kept_answer_that_does_not_fit_the_policy_is_not_replayed(make_client, answer, unsquash):
    """A kept answer that decodes (a 6-list, the step index first) but whose action is not
    one of the policy's actions, or whose numbers are not numbers: a retry gets a 409, as
    for bytes that are no kept answer, not a 500 and not the forged answer."""
    _, client = make_client(("lstm",))
    obs = observations(4, 2)
    assert (await step(client, "lstm", "f", obs[0], 0, step=0)).status_code == 200
    exported = (await client.get("/v1/models/lstm/sessions/f", headers={"accept": "application/octet-stream"})).content
    forged = forge_answer(exported, answer)
    octet = {"content-type": "application/octet-stream"}
    assert (await client.put("/v1/models/lstm/sessions/f2", content=forged, headers=octet)).status_code == 200
    retry = await step(client, "lstm", "f2", obs[0], 1, step=0, unsquash_actions=unsquash,
                       outputs=["value", "dist_inputs"])
    assert retry.status_code == 409 and error_of(retry)["field"] == "step", retry.text
    assert (await step(client, "lstm", "f2", obs[1], 1, step=1)).status_code == 200


async def test_a_kept_answer_forged_to_another_valid_answer_is_replayed(make_client):
    """The other side of the check: a kept answer that this policy could have given (here
    another raw sample) is replayed as kept, unsquashed or clipped as a retry asks, so the
    check refuses only what does not fit, and ``forge_answer`` writes records the server
    reads. Before, unsquashing or clipping a kept sample outside the Box failed (500)."""
    _, client = make_client(("lstm",))
    obs = observations(4, 2)
    assert (await step(client, "lstm", "g", obs[0], 0, step=0)).status_code == 200
    exported = (await client.get("/v1/models/lstm/sessions/g", headers={"accept": "application/octet-stream"})).content
    # A raw sample outside Box(-1, 1) (as a Gaussian's often is), a NaN logit kept as null.
    forged = forge_answer(exported, [0, [2.5, -0.5], -1.5, 0.75, None, [0.1, None, 0.3, 0.4]])
    octet = {"content-type": "application/octet-stream"}
    assert (await client.put("/v1/models/lstm/sessions/g2", content=forged, headers=octet)).status_code == 200
    retry = await step(client, "lstm", "g2", obs[0], 1, step=0, outputs=["value", "dist_inputs", "raw_action"])
    assert retry.status_code == 200, retry.text
    answer = retry.json()
    assert answer["action"] == [2.5, -0.5] and answer["logp"] == -1.5 and answer["value"] == 0.75
    assert answer["dist_inputs"] == [0.1, None, 0.3, 0.4]
    # Asked unsquashed and clipped, the same kept sample is mapped into the bounds.
    for flag, want in (("unsquash_actions", [1.0, -0.5]), ("clip_actions", [1.0, -0.5])):  # Box(-1, 1)
        again = await step(client, "lstm", "g2", obs[0], 1, step=0, **{flag: True}, outputs=["raw_action"])
        assert again.status_code == 200, (flag, again.text)
        assert again.json()["raw_action"] == [2.5, -0.5] and again.json()["action"] == want, (flag, again.text)
