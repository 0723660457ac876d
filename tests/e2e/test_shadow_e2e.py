"""A shadow candidate end to end: a real `rlserve serve`, real ONNX Runtime, real Parquet.

The live policy is an LSTM reading its previous action and reward (version 1); the
candidate is another version of it with other weights (version 2). One server for the
module; the tests run in order:

- bad input is refused naming the field (spaces, unknown model or version, queue size);
- for several seeded sessions, the shadow's logp of every taken action (``shadow/``)
  equals the candidate's own answer stepped through the same episode over HTTP, fed the
  live actions as ``prev_action``: an independent path; its own action is there too;
- the live answers are bit-identical with the shadow on and off;
- with the candidate's process stopped (SIGSTOP: nothing is taken), an episode that starts
  above the admission mark (half the queue) is not admitted and its rows are skipped, while
  the admitted episodes go on up to the queue's size; once it runs again it scores them;
- a one-row queue under load drops rows and counts them, no live request fails;
- unloading the candidate stops the shadow; the live version keeps answering.
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import svc_bundles
from server_process import running_server, wait_for

from rlserve.models.distributions import ActionDistSpec
from rlserve.service.experience import reader
from rlserve.service.experience.cli import summarize

pytestmark = pytest.mark.e2e

TOKEN = "shadow-token"
ADMIN = {"authorization": f"Bearer {TOKEN}"}
SESSIONS, STEPS = 4, 10
RAW = {"clip_actions": False, "unsquash_actions": False}  # the answered action is the model's sample


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    exported = svc_bundles.shared(tmp_path_factory, "lstm", "mlp")
    repo = tmp_path_factory.mktemp("shadow-repo")
    for name in ("lstm", "mlp"):
        svc_bundles.copy_as_version(exported / name, repo / name, "1")
    svc_bundles.export("lstm", repo / "lstm_v2", version="2", seed=1)  # other weights
    log = tmp_path_factory.mktemp("shadow-log")
    env = {"RLSERVE_REPOSITORY": str(repo), "RLSERVE_ADMIN_TOKEN": TOKEN, "RLSERVE_EXPERIENCE_LOG": str(log),
           "RLSERVE_EXPERIENCE_ROLL_S": "0.2"}
    with running_server(env=env) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client, log, repo


def _put(client, body):
    return client.put("/v1/admin/models/lstm/shadow", json=body, headers=ADMIN)


def test_bad_shadows_are_refused_naming_the_field(served):
    client, _, _ = served
    assert client.get("/v1/admin/models/lstm/shadow", headers=ADMIN).status_code == 404
    other = _put(client, {"candidate": {"model": "mlp"}, "version": "1"})
    assert other.status_code == 422
    error = other.json()["error"]
    assert error["field"] == "candidate"
    assert list(error["expected"]) == ["action_space"] and list(error["received"]) == ["action_space"]
    assert error["expected"]["action_space"]["type"] == "Box"
    assert error["received"]["action_space"]["type"] == "Discrete"
    unknown = _put(client, {"candidate": {"model": "nope"}})
    assert (unknown.status_code, unknown.json()["error"]["field"]) == (404, "candidate.model")
    version = _put(client, {"candidate": {"model": "lstm", "version": "9"}})
    assert (version.status_code, version.json()["error"]["field"]) == (404, "candidate.version")
    size = _put(client, {"candidate": {"model": "lstm", "version": "2"}, "version": "1", "queue_rows": 0})
    assert (size.status_code, size.json()["error"]["field"]) == (422, "queue_rows")
    live = _put(client, {"candidate": {"model": "lstm", "version": "2"}, "version": "7"})
    assert (live.status_code, live.json()["error"]["field"]) == (404, "version")
    assert client.get("/v1/admin/models/lstm/shadow", headers=ADMIN).status_code == 404


def _obs(rng) -> list[float]:
    return rng.uniform(-1, 1, 4).astype(np.float32).tolist()


def _play(client, prefix: str) -> list[list[dict]]:
    """``SESSIONS`` seeded episodes of ``STEPS`` steps on version 1, the last one terminated."""
    episodes = []
    for i in range(SESSIONS):
        rng = np.random.default_rng(100 + i)
        sid = f"{prefix}-{i}"
        created = client.post("/v1/models/lstm/sessions", json={"session_id": sid, "seed": i, "version": "1"})
        assert created.status_code == 201, created.text
        steps = []
        for t in range(STEPS):
            body = {"observation": _obs(rng), "session_id": sid, **RAW}
            if t:
                body["reward"] = float(rng.uniform(-1, 1))
            if t == STEPS - 1:
                body["terminated"] = True
            answer = client.post("/v1/models/lstm/act", json=body)
            assert answer.status_code == 200, answer.text
            steps.append({"request": body, "answer": answer.json()})
        episodes.append(steps)
    return episodes


def _shadow(client) -> dict:
    return client.get("/v1/admin/models/lstm/shadow", headers=ADMIN).json()


def _reference(client, episodes) -> dict[str, tuple[float, np.ndarray]]:
    """Per logged step: the candidate's logp of the live action and its dist inputs, from
    the candidate's own sessions over HTTP fed the live actions as ``prev_action``."""
    meta = client.get("/v1/models/lstm/versions/2").json()
    spec = ActionDistSpec.from_json(meta["action_dist"])
    out = {}
    for i, steps in enumerate(episodes):
        sid = f"ref-{i}"
        assert client.post("/v1/models/lstm/sessions", json={"session_id": sid, "version": "2"}).status_code == 201
        for t, step in enumerate(steps):
            body = {**step["request"], "session_id": sid, "outputs": ["dist_inputs"]}
            body.pop("terminated", None)
            if t:
                body["prev_action"] = steps[t - 1]["answer"]["action"]
            answer = client.post("/v1/models/lstm/act", json=body)
            assert answer.status_code == 200, answer.text
            dist_inputs = np.asarray([answer.json()["dist_inputs"]], np.float32)
            taken = np.asarray([step["answer"]["action"]], np.float32)
            event_id = step["answer"].get("event_id")
            if event_id is not None:
                out[event_id] = (float(spec.build(dist_inputs).logp(taken)[0]), dist_inputs[0])
    return out


def test_the_shadow_scores_every_taken_action_as_the_candidate_does(served):
    client, log, _ = served
    started = _put(client, {"candidate": {"model": "lstm", "version": "2"}, "version": "1", "queue_rows": 4096})
    assert started.status_code == 200, started.text
    assert started.json()["candidate"] == {"model": "lstm", "version": "2"}
    episodes = _play(client, "live")
    rows = SESSIONS * STEPS
    counts = wait_for(lambda: (c := _shadow(client)["counts"])["scored"] >= rows and c, show=lambda: _shadow(client))
    assert counts == {"scored": rows, "dropped": 0, "skipped_broken": 0, "skipped_not_admitted": 0, "failed": 0,
                      "unwritten": 0, "store_failures": 0}
    reference = _reference(client, episodes)
    assert len(reference) == SESSIONS * (STEPS - 1)  # the terminated row is no step of the episode

    def written():
        table = reader.shadow_scores(log, "lstm")
        return table is not None and len(table) >= len(reference) and table

    table = wait_for(written)
    scores = {row["event_id"]: row for row in table.to_pylist()}
    assert set(scores) == set(reference)
    for event_id, (logp, dist_inputs) in reference.items():
        row = scores[event_id]
        assert row["candidate"] == "lstm@2"
        np.testing.assert_allclose(row["dist_inputs"], dist_inputs, rtol=1e-5, atol=1e-6)
        assert row["logp"] == pytest.approx(logp, rel=1e-5, abs=1e-5)
        assert len(row["actions"]) == 2 and all(np.isfinite(row["actions"]))
    # The candidate's logp differs from the live model's: it is not the live answer copied.
    live_logp = {s["answer"]["event_id"]: s["answer"]["logp"] for e in episodes for s in e if "event_id" in s["answer"]}
    assert max(abs(scores[k]["logp"] - live_logp[k]) for k in reference) > 1e-3
    metrics = client.get("/metrics").text
    scored = 'rlserve_shadow_rows_total{candidate="lstm@2",model="lstm",outcome="scored",version="1"}'
    assert f"{scored} {rows}.0" in metrics

    # The reader joins the scores to the transitions once they are written.
    def joined():
        table = reader.transitions_with_shadow(log, "lstm")
        return table is not None and len(table) >= len(reference) and table

    transitions = wait_for(joined).to_pylist()
    shadowed = [t for t in transitions if t["infos"]["event_id"] in scores]
    assert len(shadowed) == len(reference)
    assert all(t["shadow_logp"] == scores[t["infos"]["event_id"]]["logp"] and t["shadow_candidate"] == "lstm@2"
               for t in shadowed)
    summary = summarize(log, "lstm")
    assert (summary["shadowed_steps"], summary["shadow_candidates"]) == (len(reference), {"lstm@2": len(reference)})
    # The reference sessions (version 2, not shadowed) have no scores.
    assert all(t["shadow_logp"] is None for t in transitions if t["infos"]["event_id"] not in scores)


def test_live_answers_are_the_same_with_the_shadow_on_and_off(served):
    client, _, _ = served
    _put(client, {"candidate": {"model": "lstm", "version": "2"}, "version": "1"})
    on = _play(client, "on")
    assert client.delete("/v1/admin/models/lstm/shadow", headers=ADMIN).status_code == 200
    off = _play(client, "off")
    answer = lambda steps: [(s["answer"]["action"], s["answer"]["logp"]) for s in steps]  # noqa: E731
    assert [answer(e) for e in on] == [answer(e) for e in off]


def test_an_episode_starting_above_the_admission_mark_is_skipped_and_admitted_ones_keep_their_room(served):
    client, _, _ = served
    started = _put(client, {"candidate": {"model": "lstm", "version": "2"}, "version": "1", "queue_rows": 4})
    assert started.status_code == 200 and started.json()["admit_below_rows"] == 2
    shadow = wait_for(lambda: (s := _shadow(client))["state"] == "running" and s, show=lambda: _shadow(client))
    rng = np.random.default_rng(7)
    # (session, starts an episode): with nothing taken, rows wait in the order sent
    plan = [("a", True), ("b", True), ("c", True),  # c starts with 2 rows waiting: not admitted
            ("a", False), ("c", False), ("b", False),  # a and b go on above the mark (4 rows wait)
            ("a", False), ("a", False), ("b", False)]  # past the queue's size: a dropped, then skipped; b dropped
    os.kill(shadow["process_id"], signal.SIGSTOP)
    try:
        for sid, start in plan:
            body = {"observation": _obs(rng), "session_id": f"admit-{sid}", "episode_start": start}
            assert client.post("/v1/models/lstm/versions/1/act", json=body).status_code == 200
        waiting = wait_for(lambda: (s := _shadow(client))["queue_depth"] == 4 and s, show=lambda: _shadow(client))
    finally:
        os.kill(shadow["process_id"], signal.SIGCONT)
    assert waiting["counts"]["skipped_not_admitted"] == 2
    counts = wait_for(lambda: (c := _shadow(client)["counts"])["scored"] == 4 and c, show=lambda: _shadow(client))
    assert (counts["dropped"], counts["skipped_broken"], counts["skipped_not_admitted"]) == (2, 1, 2)
    metrics = client.get("/metrics").text
    assert 'outcome="skipped_not_admitted",version="1"} 2.0' in metrics


def test_a_tiny_queue_under_load_drops_and_counts_and_no_live_request_fails(served):
    client, _, _ = served
    assert _put(client, {"candidate": {"model": "lstm", "version": "2"}, "version": "1",
                         "queue_rows": 1}).status_code == 200

    rows = 8  # sessions per request: a batch offers 8 rows at once to a queue of one

    def episodes(i: int) -> list[int]:
        with httpx.Client(base_url=str(client.base_url), timeout=30) as own:
            rng = np.random.default_rng(i)
            statuses = []
            for t in range(20):
                body = {"observations": [_obs(rng) for _ in range(rows)],
                        "session_ids": [f"load-{i}-{k}" for k in range(rows)], "episode_starts": [t == 0] * rows}
                statuses.append(own.post("/v1/models/lstm/versions/1/act", json=body).status_code)
            return statuses

    with ThreadPoolExecutor(8) as pool:
        statuses = [s for result in pool.map(episodes, range(16)) for s in result]
    assert statuses == [200] * len(statuses)
    handed = len(statuses) * rows

    def accounted() -> dict | None:  # every handed row scored, dropped or skipped (a row may still be in the child)
        counts = _shadow(client)["counts"]
        skipped = counts["skipped_broken"] + counts["skipped_not_admitted"]
        return counts if counts["scored"] + counts["dropped"] + skipped == handed else None

    counts = wait_for(accounted, show=lambda: (handed, _shadow(client)))
    assert counts["dropped"] > 0
    assert counts["skipped_broken"] > 0  # the later rows of sessions a drop broke
    metrics = client.get("/metrics").text
    assert f'outcome="dropped",version="1"}} {counts["dropped"]}.0' in metrics


def test_unloading_the_candidate_stops_the_shadow_and_the_live_version_serves_on(served):
    client, _, _ = served
    assert _put(client, {"candidate": {"model": "lstm", "version": "2"}, "version": "1"}).status_code == 200
    assert client.delete("/v1/admin/models/lstm/versions/2", headers=ADMIN).status_code == 200
    shadow = _shadow(client)
    assert (shadow["state"], shadow["stopped_because"]) == ("stopped", "candidate unloaded")
    answer = client.post("/v1/models/lstm/versions/1/act", json={"observation": [0.1, 0.2, 0.3, 0.4]})
    assert (answer.status_code, answer.json()["version"]) == (200, "1")
