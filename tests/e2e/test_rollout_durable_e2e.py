"""A canary's draw is in the session's record: with the Redis store, a session keeps the
version it was drawn to across a SIGKILL of its server, even when the restarted server
has other weights. Real redis-server, real `rlserve serve`, two real versions."""

from __future__ import annotations

import pytest
from plain_http import HTTP
from rollout_bundles import two_versions
from server_process import ServerProcess

pytestmark = pytest.mark.e2e

SESSIONS = 30


def _act(url: str, session_id: str, start: bool) -> dict:
    body = {"observation": [0.01, -0.02, 0.03, 0.04], "session_id": session_id, "explore": False,
            "episode_start": start, **({} if start else {"reward": 1.0})}
    reply = HTTP.post(f"{url}/v1/models/cartpole/act", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_a_session_keeps_its_drawn_version_across_a_sigkill(redis_server, tmp_path):
    repo = two_versions(tmp_path)
    server = ServerProcess({"RLSERVE_REPOSITORY": str(repo), "RLSERVE_SESSION_STORE": redis_server.url,
                            "RLSERVE_CANARY": '{"cartpole": {"1": 50, "2": 50}}'})
    try:
        server.start()
        drawn = {f"kept-{i}": _act(server.url, f"kept-{i}", True)["version"] for i in range(SESSIONS)}
        assert set(drawn.values()) == {"1", "2"}  # Binomial(30, 0.5): one version only has odds 2**-29
        server.kill()  # SIGKILL: nothing is written on the way down
        server.env["RLSERVE_CANARY"] = '{"cartpole": {"1": 100, "2": 0}}'  # new episodes to version 1 only
        server.start()
        for session_id, version in drawn.items():
            assert _act(server.url, session_id, False)["version"] == version, session_id
        assert {_act(server.url, f"new-{i}", True)["version"] for i in range(10)} == {"1"}
    finally:
        server.stop()
