"""The shadow's per-session state survives a SIGKILL of the replica (a real redis-server).

The live LSTM (version 1) is shadowed by another version of it (version 2), started by
``RLSERVE_SHADOW``. The same seeded episode is played twice: once without interruption,
once with the server killed (SIGKILL) after its shadow scored the first steps, and started
again. The live session lives in Redis, so its answers go on unchanged; the shadow's
state lives there too (a namespace of its own), so its scores of the steps after the
restart equal those of the uninterrupted run.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import svc_bundles
from plain_http import HTTP
from server_process import ServerProcess, wait_for

from rlserve.service.experience import reader

pytestmark = pytest.mark.e2e

TOKEN = "shadow-token"
STEPS, KILL_AFTER = 6, 3


def _body(sid: str, t: int) -> dict:
    rng = np.random.default_rng(t)
    body = {"observation": rng.uniform(-1, 1, 4).astype(np.float32).tolist(), "session_id": sid}
    if t:
        body["reward"] = float(rng.uniform(-1, 1))
    return body


def _scored(url: str) -> int:
    shadow = HTTP.get(f"{url}/v1/admin/models/lstm/shadow", headers={"authorization": f"Bearer {TOKEN}"}).json()
    return shadow["counts"]["scored"]


def _written(log) -> set[str]:
    table = reader.shadow_scores(log, "lstm") if log.exists() else None
    return set() if table is None else set(table.column("event_id").to_pylist())


def _step(url: str, sid: str, t: int) -> dict:
    answer = HTTP.post(f"{url}/v1/models/lstm/act", json=_body(sid, t), timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_sessions_shadow_state_survives_a_sigkill(tmp_path, tmp_path_factory, redis_server):
    exported = svc_bundles.shared(tmp_path_factory, "lstm")
    repo = tmp_path / "repo"
    svc_bundles.copy_as_version(exported / "lstm", repo / "lstm", "1")
    svc_bundles.export("lstm", repo / "lstm_v2", version="2", seed=1)
    log = tmp_path / "log"
    env = {"RLSERVE_REPOSITORY": str(repo), "RLSERVE_ADMIN_TOKEN": TOKEN, "RLSERVE_SESSION_STORE": redis_server.url,
           "RLSERVE_EXPERIENCE_LOG": str(log), "RLSERVE_EXPERIENCE_ROLL_S": "0.2",
           "RLSERVE_SHADOW": json.dumps({"lstm": {"candidate": "lstm@2", "version": "1"}})}
    server = ServerProcess(env).start()
    try:
        for sid in ("whole", "killed"):
            created = HTTP.post(f"{server.url}/v1/models/lstm/sessions", json={"session_id": sid, "seed": 5,
                                                                               "version": "1"})
            assert created.status_code == 201, created.text
        whole = [_step(server.url, "whole", t) for t in range(STEPS)]
        killed = [_step(server.url, "killed", t) for t in range(KILL_AFTER)]
        wait_for(lambda: _scored(server.url) == STEPS + KILL_AFTER)
        # The uninterrupted episode's scores on disk before the kill (a roll writes them within ~0.25 s).
        wait_for(lambda: {a["event_id"] for a in whole} <= _written(log))
        server.kill()  # SIGKILL: no shutdown of any kind
        server = ServerProcess(env, port=server.port).start()
        killed += [_step(server.url, "killed", t) for t in range(KILL_AFTER, STEPS)]
        wait_for(lambda: _scored(server.url) == STEPS - KILL_AFTER)
        shadow = HTTP.get(f"{server.url}/v1/admin/models/lstm/shadow",
                           headers={"authorization": f"Bearer {TOKEN}"}).json()
        assert shadow["counts"]["skipped_broken"] == 0 and shadow["state_store"] == "external"
        assert server.terminate() in (0, -15)  # writes what the log holds
    finally:
        server.stop()
    # The live session went on in Redis: the same answers as the uninterrupted episode.
    assert [a["action"] for a in killed] == [a["action"] for a in whole]
    scores = {row["event_id"]: row for row in reader.shadow_scores(log, "lstm").to_pylist()}
    pairs = list(zip(killed, whole, strict=True))[KILL_AFTER:]
    after = [(scores[k["event_id"]], scores[w["event_id"]]) for k, w in pairs]
    assert len(after) == STEPS - KILL_AFTER
    for restarted, uninterrupted in after:
        assert restarted["logp"] == pytest.approx(uninterrupted["logp"], rel=1e-6, abs=1e-6)
        np.testing.assert_allclose(restarted["dist_inputs"], uninterrupted["dist_inputs"], rtol=1e-6, atol=1e-6)
