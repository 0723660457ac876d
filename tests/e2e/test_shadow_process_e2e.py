"""The shadow's candidate process: its failures reach no live request, and it never
outlives the server (a real `rlserve serve`, real ONNX Runtime, real processes).

One server for the module (the LSTM as versions 1 and 2); the tests run in order:

- a candidate whose bundle cannot be loaded in its process (its model file damaged on disk
  after the server loaded it): the shadow says why it stopped, the server's log holds the
  process's traceback, live answers go on;
- a candidate process killed mid-traffic: the shadow says so, the rows after it are
  counted as dropped, and no live request fails;
- a SIGKILL of the server (its process alone, not its group) leaves no candidate process.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import numpy as np
import pytest
import svc_bundles
from server_process import ServerProcess, wait_for

pytestmark = pytest.mark.e2e

TOKEN = "shadow-token"
ADMIN = {"authorization": f"Bearer {TOKEN}"}
SHADOW = {"candidate": {"model": "lstm", "version": "2"}, "version": "1"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    exported = svc_bundles.shared(tmp_path_factory, "lstm")
    repo = tmp_path_factory.mktemp("shadow-process-repo")
    svc_bundles.copy_as_version(exported / "lstm", repo / "lstm", "1")
    svc_bundles.copy_as_version(exported / "lstm", repo / "lstm_v2", "2")
    server = ServerProcess({"RLSERVE_REPOSITORY": str(repo), "RLSERVE_ADMIN_TOKEN": TOKEN,
                            "RLSERVE_LOG_LEVEL": "info"}).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            yield server, client, repo
    finally:
        server.stop()


def _shadow(client) -> dict:
    return client.get("/v1/admin/models/lstm/shadow", headers=ADMIN).json()


def _steps(client, sid: str, count: int) -> list[int]:
    """``count`` steps of session ``sid`` (created here) on version 1; their statuses."""
    created = client.post("/v1/models/lstm/sessions", json={"session_id": sid, "version": "1"})
    assert created.status_code == 201, created.text
    rng = np.random.default_rng(len(sid))
    return [client.post("/v1/models/lstm/act", json={"observation": rng.uniform(-1, 1, 4).tolist(),
                                                      "session_id": sid}).status_code for _ in range(count)]


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_candidate_its_process_cannot_load_is_reported_and_live_answers_go_on(served):
    server, client, repo = served
    model = repo / "lstm_v2" / "model.onnx"
    kept = model.read_bytes()
    model.write_bytes(b"not an onnx model")  # the server loaded version 2 already; the process reads it anew
    try:
        assert client.put("/v1/admin/models/lstm/shadow", json=SHADOW, headers=ADMIN).status_code == 200
        shadow = wait_for(lambda: (s := _shadow(client))["state"] == "stopped" and s, show=lambda: _shadow(client))
    finally:
        model.write_bytes(kept)
    assert shadow["stopped_because"].startswith("candidate process failed: BundleError: model.onnx"), shadow
    assert "model.onnx" in shadow["stopped_because"]
    assert "the candidate cannot be run" in server.output()  # the process logged its traceback
    assert not _alive(shadow["process_id"])
    assert _steps(client, "after-failure", 5) == [200] * 5
    after = _shadow(client)
    assert after["counts"]["dropped"] == 5 and after["counts"]["scored"] == 0


def test_a_killed_candidate_process_is_counted_and_no_live_request_fails(served):
    _, client, _ = served
    assert client.put("/v1/admin/models/lstm/shadow", json=SHADOW, headers=ADMIN).status_code == 200
    assert _steps(client, "before-kill", 5) == [200] * 5
    wait_for(lambda: _shadow(client)["counts"]["scored"] == 5, show=lambda: _shadow(client))
    pid = _shadow(client)["process_id"]
    assert {os.sched_getscheduler(int(t)) for t in os.listdir(f"/proc/{pid}/task")} == {os.SCHED_IDLE}
    os.kill(pid, signal.SIGKILL)
    assert _steps(client, "after-kill", 20) == [200] * 20
    shadow = wait_for(lambda: (s := _shadow(client))["state"] == "stopped" and s, show=lambda: _shadow(client))
    assert shadow["stopped_because"] == f"candidate process failed: exit status {-signal.SIGKILL}"
    counts = shadow["counts"]
    assert counts["scored"] == 5 and counts["failed"] == 0
    assert counts["scored"] + counts["dropped"] + counts["skipped_broken"] == 25
    metrics = client.get("/metrics").text
    assert f'outcome="dropped",version="1"}} {counts["dropped"]}.0' in metrics


def test_the_candidate_process_does_not_outlive_a_sigkilled_server(served):
    server, client, _ = served
    assert client.put("/v1/admin/models/lstm/shadow", json=SHADOW, headers=ADMIN).status_code == 200
    assert _steps(client, "before-server-kill", 3) == [200] * 3
    wait_for(lambda: _shadow(client)["counts"]["scored"] == 3, show=lambda: _shadow(client))
    pid = _shadow(client)["process_id"]
    assert _alive(pid)
    os.kill(server.proc.pid, signal.SIGKILL)  # the server alone: its process group lives on
    server.proc.wait()
    wait_for(lambda: not _alive(pid), timeout=15)
