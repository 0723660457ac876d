"""End to end: `rlserve serve` as a real uvicorn process on a free port."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import svc_bundles

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e
OBS = [0.1, -0.2, 0.3, 0.05]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(base: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=base, timeout=1.0) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"server exited early with {proc.returncode}: {proc.log.read_text()}")
            try:
                if client.get("/readyz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)  # poll interval
    raise AssertionError("server never became ready")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("e2e_repo")
    exported = svc_bundles.shared(tmp_path_factory, "mlp", "lstm")
    for name in ("mlp", "lstm"):
        shutil.copytree(exported / name, repo / name)
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RLSERVE_MAX_BATCH_DELAY_MS": "1"}
    log = repo / "server.log"  # a file, not a pipe: a full pipe would block the server
    with open(log, "w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlserve.service.cli", "serve", "--repository", str(repo), "--port", str(port)],
            cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, text=True)
    proc.log = log
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(base, proc)
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_act_sessions_and_errors_over_a_socket(server):
    base, _ = server
    with httpx.Client(base_url=base) as client:
        assert client.get("/readyz").json()["models"] == {"mlp": "1", "lstm": "1"}
        r = client.post("/v1/models/mlp/act", json={"observation": OBS, "outputs": ["value"]})
        assert r.status_code == 200 and r.json()["action"] in (0, 1, 2)
        assert r.headers["content-type"] == "application/json"
        r = client.post("/v1/models/mlp/act", json={"observations": [OBS] * 5, "explore": False})
        assert len(set(r.json()["actions"])) == 1
        r = client.post("/v1/models/lstm/act", json={"observation": OBS, "session_id": "e2e", "episode_start": True})
        assert r.status_code == 200 and r.json()["session_id"] == "e2e"
        r = client.post("/v1/models/lstm/act", json={"observation": OBS, "session_id": "e2e", "reward": 1.0})
        assert r.status_code == 200
        assert client.delete("/v1/models/lstm/sessions/e2e").status_code == 200
        r = client.post("/v1/models/lstm/act", json={"observation": OBS, "session_id": "e2e"})
        assert r.status_code == 410 and r.json()["error"]["code"] == "session_expired"
        r = client.post("/v1/models/mlp/act", content=b"{", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
        assert client.get("/v1/admin/models").status_code == 404  # no admin token configured
        assert "rlserve_batch_size_rows_bucket" in client.get("/metrics").text


def test_concurrent_clients_share_batches(server):
    base, _ = server

    async def run() -> list[dict]:
        async with httpx.AsyncClient(base_url=base, limits=httpx.Limits(max_connections=32)) as client:
            responses = await asyncio.gather(*(
                client.post("/v1/models/mlp/act", json={"observation": OBS, "debug": True}) for _ in range(64)))
        assert all(r.status_code == 200 for r in responses)
        return [r.json()["debug"] for r in responses]

    debug = asyncio.run(run())
    assert max(d["batch_requests"] for d in debug) > 1  # 64 concurrent requests did not run one by one


def test_large_body_streams_in_chunks(server):
    base, _ = server
    with httpx.Client(base_url=base) as client:
        r = client.post("/v1/models/mlp/act", json={"observations": [OBS] * 5000, "explore": False})
        assert r.status_code == 200 and len(r.json()["actions"]) == 5000


def test_sigterm_shuts_down_cleanly(server):
    _, proc = server
    proc.send_signal(signal.SIGTERM)
    # uvicorn shuts down gracefully, then re-raises the signal it caught.
    assert proc.wait(timeout=20) in (0, -signal.SIGTERM)
    log = proc.log.read_text()
    assert "Application shutdown complete" in log and "Traceback" not in log
