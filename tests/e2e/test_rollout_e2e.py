"""A 90/10 canary of two real CartPole versions under concurrent clients: a real `rlserve
serve`, real ONNX Runtime, 16 client threads playing episodes over HTTP.

Checked on every step of every episode: the answer's version never changes within an
episode. About 10% of the episodes drawn before the weights change go to version 2
(binomial, bounds that cannot flake); the weights changed mid-run move no live episode;
the summary's per-version returns separate the two versions and equal the returns the
clients computed; promote and rollback change where new episodes go.
"""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import gymnasium as gym
import httpx
import pytest
from plain_http import HTTP
from rollout_bundles import two_versions
from server_process import running_server

pytestmark = pytest.mark.e2e

TOKEN = "rollout-token"
ADMIN = {"authorization": f"Bearer {TOKEN}"}
THREADS, EPISODES, MAX_STEPS = 16, 8, 60


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = two_versions(tmp_path_factory.mktemp("rollout"))
    env = {"RLSERVE_REPOSITORY": str(repo), "RLSERVE_ADMIN_TOKEN": TOKEN,
           "RLSERVE_CANARY": '{"cartpole": {"1": 90, "2": 10}}'}
    with running_server(env=env) as url:
        yield url


def _episode(client: httpx.Client, url: str, seed: int, changed: threading.Event) -> dict:
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    sid = f"ep-{uuid.uuid4().hex}"
    versions, total, reward, length = [], 0.0, None, 0
    before_change = not changed.is_set()
    end = None
    for t in range(MAX_STEPS + 1):
        body = {"observation": obs.tolist(), "session_id": sid, "explore": False, "episode_start": t == 0}
        if reward is not None:
            body["reward"] = reward
        if end:
            body[end] = True
        answer = client.post(f"{url}/v1/models/cartpole/act", json=body).json()
        versions.append(answer["version"])
        if end:
            break
        obs, reward, terminated, truncated, _ = env.step(answer["action"])
        total += reward
        length += 1
        if terminated or truncated or t + 1 == MAX_STEPS:
            end = "terminated" if terminated else "truncated"
    assert client.delete(f"{url}/v1/models/cartpole/sessions/{sid}").status_code == 200
    return {"versions": versions, "return": total, "length": length, "before_change": before_change}


def _client_thread(url: str, index: int, changed: threading.Event) -> list[dict]:
    with httpx.Client(timeout=30) as client:
        return [_episode(client, url, index * 1000 + k, changed) for k in range(EPISODES)]


def test_a_canary_keeps_every_episode_on_one_version_and_scores_each(server):
    changed = threading.Event()
    with ThreadPoolExecutor(THREADS) as pool:
        futures = [pool.submit(_client_thread, server, i, changed) for i in range(THREADS)]
        # Mid-run, the split flips: live episodes must stay where they are.
        while sum(f.done() for f in futures) == 0 and not changed.is_set():
            summary = HTTP.get(f"{server}/v1/admin/models/cartpole/summary", headers=ADMIN).json()
            if sum(v["episodes"] for v in summary["versions"].values()) >= THREADS * EPISODES // 2:
                reply = HTTP.put(f"{server}/v1/admin/models/cartpole/traffic", headers=ADMIN,
                                  json={"weights": {"1": 10, "2": 90}, "reason": "test flips"})
                assert reply.status_code == 200, reply.text
                changed.set()
        episodes = [e for f in futures for e in f.result()]
    assert changed.is_set()
    for episode in episodes:  # every step of every episode on one version
        assert len(set(episode["versions"])) == 1, episode["versions"]
    before = [e for e in episodes if e["before_change"]]
    on_two = sum(e["versions"][0] == "2" for e in before)
    # Binomial(n, 0.1): mean 0.1 n, sd 0.3 sqrt(n); 6 sd either side cannot flake.
    n = len(before)
    assert n >= THREADS * EPISODES // 3
    assert 0.1 * n - 6 * 0.3 * n ** 0.5 <= on_two <= 0.1 * n + 6 * 0.3 * n ** 0.5, (on_two, n)
    after = [e for e in episodes if not e["before_change"] and e["versions"][0] == "2"]
    assert after, "no episode started after the flip went to version 2"

    summary = HTTP.get(f"{server}/v1/admin/models/cartpole/summary", headers=ADMIN).json()
    for version in ("1", "2"):
        mine = [e for e in episodes if e["versions"][0] == version]
        got = summary["versions"][version]
        assert got["episodes"] == len(mine)
        assert got["return_mean"] == pytest.approx(sum(e["return"] for e in mine) / len(mine), rel=1e-9)
        assert got["episode_length_mean"] == pytest.approx(sum(e["length"] for e in mine) / len(mine), rel=1e-9)
        assert got["requests"] == sum(len(e["versions"]) for e in mine)
    assert summary["versions"]["1"]["return_mean"] > summary["versions"]["2"]["return_mean"] + 20
    assert [c["action"] for c in summary["changes"]] == ["weights", "weights"]
    assert summary["changes"][-1]["reason"] == "test flips"
    metrics = HTTP.get(f"{server}/metrics").text
    episodes_two = float(summary["versions"]["2"]["episodes"])
    assert f'rlserve_version_episodes_total{{model="cartpole",version="2"}} {episodes_two}' in metrics


def test_promote_rollback_and_the_guard(server):
    def new_session_version() -> str:
        body = {"observation": [0.0, 0.0, 0.0, 0.0], "session_id": f"p-{uuid.uuid4().hex}", "episode_start": True}
        return HTTP.post(f"{server}/v1/models/cartpole/act", json=body).json()["version"]

    reply = HTTP.post(f"{server}/v1/admin/models/cartpole/promote", headers=ADMIN, json={"version": "1"})
    assert reply.json()["weights"] == {"1": 100.0, "2": 0.0}
    assert {new_session_version() for _ in range(20)} == {"1"}
    reply = HTTP.post(f"{server}/v1/admin/models/cartpole/rollback", headers=ADMIN, json={})
    assert reply.status_code == 200 and reply.json()["split"] is True
    # The guard: version 2 scored far worse, so setting it with the split 50/50 fires at the next episode end.
    HTTP.put(f"{server}/v1/admin/models/cartpole/traffic", headers=ADMIN, json={"weights": {"1": 50, "2": 50}})
    reply = HTTP.put(f"{server}/v1/admin/models/cartpole/guard", headers=ADMIN,
                      json={"margin": 10, "min_episodes": 3})
    assert reply.status_code == 200, reply.text
    sid = f"g-{uuid.uuid4().hex}"
    HTTP.post(f"{server}/v1/models/cartpole/versions/1/act", json={"observation": [0.0] * 4, "session_id": sid,
                                                                     "episode_start": True})
    HTTP.post(f"{server}/v1/models/cartpole/act", json={"observation": [0.0] * 4, "session_id": sid,
                                                         "reward": 1.0, "terminated": True})
    summary = HTTP.get(f"{server}/v1/admin/models/cartpole/summary", headers=ADMIN).json()
    assert summary["weights"] == {"1": 100.0, "2": 0.0}
    assert summary["changes"][-1]["action"] == "guard" and "below version '1'" in summary["changes"][-1]["reason"]


@pytest.mark.parametrize("path,body,field", [
    ("traffic", {"weights": {"1": 0, "2": 0}}, "weights"),  # 422 no_traffic
    ("traffic", {"weights": {"1": -1, "2": 5}}, "weights.1"),
    ("traffic", {"weights": {"1": 1, "9": 5}}, "weights.9"),
    ("traffic", {"weights": []}, "weights"),
    ("traffic", {}, "weights"),
    ("guard", {"margin": -1, "min_episodes": 3}, "margin"),
    ("guard", {"margin": 1, "min_episodes": 0}, "min_episodes"),
    ("promote", {"version": "7"}, "version"),
    ("promote", {"version": "1", "reason": "x" * 300}, "reason"),
])
def test_bad_rollout_requests_name_the_field(server, path, body, field):
    method = HTTP.post if path == "promote" else HTTP.put
    reply = method(f"{server}/v1/admin/models/cartpole/{path}", headers=ADMIN, json=body)
    assert 400 <= reply.status_code < 500, reply.text
    error = reply.json()["error"]
    assert error["field"] == field, error
    assert HTTP.get(f"{server}/v1/admin/models/nope/traffic", headers=ADMIN).status_code == 404
    assert HTTP.get(f"{server}/v1/admin/models/cartpole/traffic").status_code == 401
