"""The experience log inside the app: what a session step records, event ids, sampling,
delayed rewards, and the new act fields (terminated / truncated)."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from rlserve.service.act.wire import decode_request
from rlserve.service.app import create_app
from rlserve.service.experience import reader
from rlserve.service.settings import Settings

pytestmark = pytest.mark.asyncio

ACT = "/v1/models/cartpole/act"


def _app(tmp_path, **settings):
    app = create_app(Settings(experience_log=tmp_path / "log", **settings))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    return app, client


def _obs(t: int) -> list[float]:
    return np.random.default_rng(t).uniform(-0.05, 0.05, 4).astype(np.float32).tolist()


async def _episode(client, session: str, steps: int, *, end: str | None = "terminated", start: int = 0) -> list[dict]:
    """Play ``steps`` steps (then the last observation with ``end``); the answers."""
    answers = []
    for t in range(steps + (1 if end else 0)):
        body: dict = {"observation": _obs(start + t), "session_id": session}
        if t == 0:
            body.update(episode_start=True, seed=5)
        else:
            body["reward"] = 0.5 * t
        if end and t == steps:
            body[end] = True
        response = await client.post(ACT, json=body)
        assert response.status_code == 200, response.text
        answers.append(response.json())
    return answers



async def test_the_rows_of_one_batch_each_log_their_own_observation(tmp_path):
    """Five sessions' steps run as one batch (as the batcher runs them): each logged row has
    its own request's observation and next observation (the recorder slices plain rows out of
    the batch's array) and the event id its answer carried."""
    app, _ = _app(tmp_path)
    service = app.state.act_service

    def one_batch(t: int, **extra) -> list:
        accepted = [service.accept("cartpole", None, decode_request(json.dumps(
            {"observation": _obs(10 * k + t), "session_id": f"b{k}", **extra}).encode()), 0.0) for k in range(5)]
        assert all(a.step.obs is None for a in accepted)  # plain rows: converted once, with the batch
        accepted[0].policy.step.run([a.step for a in accepted])
        for a in accepted:
            service.abandon(a)
        return [a.step.event_ids[0] for a in accepted]

    served = [one_batch(0, episode_start=True), one_batch(1, reward=1.0)]
    one_batch(2, reward=1.0, terminated=True)
    app.state.experience.close()
    rows = reader.transitions(tmp_path / "log", "cartpole").to_pylist()
    assert len(rows) == 10
    for row in rows:
        k, t = int(row["eps_id"].split(":")[0][1:]), row["t"]
        assert row["obs"] == _obs(10 * k + t) and row["new_obs"] == _obs(10 * k + t + 1)
        assert row["infos"]["event_id"] == served[t][k]

async def test_each_session_step_is_a_transition_with_its_answer(tmp_path):
    app, client = _app(tmp_path)
    async with client:
        answers = await _episode(client, "e1", 5)
    app.state.experience.close()
    assert all("event_id" in a for a in answers[:5]) and "event_id" not in answers[5]  # the last obs is no step
    table = reader.transitions(tmp_path / "log", "cartpole")
    assert table.num_rows == 5
    rows = table.to_pylist()
    for t, row in enumerate(rows):
        assert row["t"] == t and row["obs"] == _obs(t) and row["new_obs"] == _obs(t + 1)
        assert row["actions"] == answers[t]["action"]
        assert row["action_logp"] == pytest.approx(answers[t]["logp"], rel=1e-6)
        assert row["rewards"] == 0.5 * (t + 1)  # reported with the next step
        assert row["infos"]["event_id"] == answers[t]["event_id"] and row["infos"]["version"] == "1"
        assert row["terminateds"] == (t == 4) and not row["truncateds"]
    [episode] = reader.episodes(tmp_path / "log", "cartpole")
    assert episode.whole and episode.is_terminated and len(episode) == 5


async def test_a_batch_request_logs_each_session_row_and_answers_event_ids(tmp_path):
    app, client = _app(tmp_path)
    async with client:
        first = await client.post(ACT, json={"observations": [_obs(0), _obs(1), _obs(2)],
                                             "session_ids": ["a", None, "b"], "episode_starts": [True, False, True]})
        last = await client.post(ACT, json={"observations": [_obs(3), _obs(4)], "session_ids": ["a", "b"],
                                            "rewards": [1.0, 2.0], "truncateds": [True, False],
                                            "terminateds": [False, True]})
    app.state.experience.close()
    ids = first.json()["event_ids"]
    assert ids[0] and ids[1] is None and ids[2]  # a stateless row is not logged
    assert last.json()["event_ids"] == [None, None]
    rows = {r["eps_id"].split(":")[0]: r for r in reader.transitions(tmp_path / "log", "cartpole").to_pylist()}
    assert (rows["a"]["truncateds"], rows["a"]["terminateds"], rows["a"]["rewards"]) == (True, False, 1.0)
    assert (rows["b"]["truncateds"], rows["b"]["terminateds"], rows["b"]["new_obs"]) == (False, True, _obs(4))


async def test_models_not_named_are_not_logged_and_a_rate_samples_episodes(tmp_path):
    app, client = _app(tmp_path, experience_models={"cartpole-memory": 1.0})
    async with client:
        answers = await _episode(client, "x", 2)
    app.state.experience.close()
    assert not any("event_id" in a for a in answers)
    assert not (tmp_path / "log" / "cartpole").exists()

    app, client = _app(tmp_path, experience_sample=0.0)
    async with client:
        assert not any("event_id" in a for a in await _episode(client, "y", 2))
        response = await client.post("/v1/models/cartpole/experience/rewards",
                                     json={"rewards": [{"event_id": "e", "reward": 1}]})
        assert response.status_code == 404  # the model is not logged here
    app.state.experience.close()


async def test_an_episode_restarted_before_its_end_counts_as_unfinished(tmp_path):
    app, client = _app(tmp_path)
    async with client:
        await _episode(client, "r", 3, end=None)
        await _episode(client, "r", 2, start=10)  # episode_start again: the open step is lost
        metrics = (await client.get("/metrics")).text
    app.state.experience.close()
    assert "rlserve_experience_unfinished_total 1.0" in metrics
    runs = reader.episodes(tmp_path / "log", "cartpole")
    assert sorted((len(e), e.done) for e in runs) == [(2, False), (2, True)]


async def test_delayed_rewards_join_logged_steps_by_event_id(tmp_path):
    app, client = _app(tmp_path)
    async with client:
        answers = await _episode(client, "d", 3)
        route = "/v1/models/cartpole/experience/rewards"
        accepted = await client.post(route, json={"rewards": [
            {"event_id": answers[0]["event_id"], "reward": 10.0},
            {"event_id": answers[2]["event_id"], "reward": -3.0, "mode": "replace"}]})
        bad = await client.post(route, json={"rewards": [{"event_id": "x", "reward": 1.0, "mode": "multiply"}]})
        empty = await client.post(route, json={"rewards": []})
    app.state.experience.close()
    assert accepted.status_code == 202 and accepted.json() == {"accepted": 2}
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "rewards[0].mode"
    assert empty.status_code == 400
    assert reader.transitions(tmp_path / "log", "cartpole").column("rewards").to_pylist() == [10.5, 1.0, -3.0]


async def test_rewards_for_steps_never_served_are_counted(tmp_path):
    """Taken like any other (202), but counted: by the server where it can tell at once (not an
    event id; one of its own it has not given), by `rlserve experience summary` always."""
    from rlserve.service.experience.cli import _text, summarize

    app, client = _app(tmp_path)
    async with client:
        answers = await _episode(client, "u", 2)
        prefix = answers[0]["event_id"].split("-")[0]
        route = "/v1/models/cartpole/experience/rewards"
        accepted = await client.post(route, json={"rewards": [
            {"event_id": answers[0]["event_id"], "reward": 1.0},  # served and logged
            {"event_id": "order-1234", "reward": 1.0},  # not an event id
            {"event_id": f"{prefix}-ffffff", "reward": 1.0},  # this server's form, never given
            {"event_id": "0f3a9c51d2-1a", "reward": 1.0}]})  # may be another replica's: known later
        metrics = (await client.get("/metrics")).text
    app.state.experience.close()
    assert accepted.status_code == 202 and accepted.json() == {"accepted": 4}
    assert "rlserve_experience_rewards_unmatched_total 2.0" in metrics
    facts = summarize(tmp_path / "log", "cartpole")
    assert (facts["delayed_rewards"], facts["unmatched_rewards"]) == (4, 3)
    assert ("  delayed rewards: 4, 3 of them for event ids no logged step has (they change nothing)"
            in _text({"cartpole": facts}).splitlines())


@pytest.mark.parametrize(("body", "field", "expected"), [
    # JSON's escape of a lone surrogate: Parquet cannot hold it, and the rewards file it
    # went to failed whole, dropping every other client's rewards queued beside it.
    (b'{"rewards":[{"event_id":"\\ud800","reward":1}]}', "rewards[0].event_id", "valid Unicode text"),
    (b'{"rewards":[{"event_id":"x","reward":1},{"event_id":"a\\udfffb","reward":1}]}', "rewards[1].event_id",
     "valid Unicode text"),
    (b'{"rewards":[{"event_id":"x","reward":"1.5"}]}', "rewards[0].reward", "a number"),  # was taken as 1.5
    (b'{"rewards":[{"event_id":"x","reward":true}]}', "rewards[0].reward", "a number"),  # was taken as 1.0
    (b'{"rewards":[{"event_id":"x","reward":1e400}]}', "rewards[0].reward", "a finite number"),
])
async def test_a_bad_reward_is_refused_and_the_others_are_written(tmp_path, body, field, expected):
    app, client = _app(tmp_path)
    async with client:
        answers = await _episode(client, "v", 2)
        route = "/v1/models/cartpole/experience/rewards"
        valid = await client.post(route, json={"rewards": [{"event_id": answers[1]["event_id"], "reward": 7,
                                                            "mode": "replace"}]})
        refused = await client.post(route, content=body, headers={"content-type": "application/json"})
    app.state.experience.close()
    assert valid.status_code == 202, valid.text  # an integer is a JSON number
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["field"] == field and error["expected"].startswith(expected), error
    assert app.state.experience.writer.dropped == {}
    assert reader.transitions(tmp_path / "log", "cartpole").column("rewards").to_pylist() == [0.5, 7.0]


async def test_the_log_is_off_by_default_and_answers_carry_no_event_id(tmp_path):
    app = create_app(Settings())
    assert app.state.experience is None
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        answer = await client.post(ACT, json={"observation": _obs(0), "session_id": "s", "episode_start": True})
        rewards = await client.post("/v1/models/cartpole/experience/rewards",
                                    json={"rewards": [{"event_id": "e", "reward": 1}]})
    assert "event_id" not in answer.json()
    assert rewards.status_code == 404


@pytest.mark.parametrize(("body", "field", "status"), [
    ({"observation": [0, 0, 0, 0], "terminateds": [True]}, "terminateds", 400),
    ({"observations": [[0, 0, 0, 0]], "truncated": True}, "truncated", 400),
    ({"observations": [[0, 0, 0, 0]], "terminateds": [True, False]}, "terminateds", 422),  # one flag per row
])
async def test_the_end_flags_take_the_request_form(tmp_path, body, field, status):
    app, client = _app(tmp_path)
    async with client:
        response = await client.post(ACT, json=body)
    app.state.experience.close()
    assert response.status_code == status and response.json()["error"]["field"] == field
