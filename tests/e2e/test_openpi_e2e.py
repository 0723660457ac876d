"""openpi's robot client, unchanged, against one real `rlserve serve` (docs/api.md "openpi's protocol").

The client is the real ``openpi-client`` from PyPI in an environment of its own
(``tests/openpi_venv.py``: it pins numpy<2); ``openpi_play.py`` runs there and plays CartPole
through ``/v1/models/cartpole/openpi`` and the root path (``RLSERVE_OPENPI_MODEL``). What it
saw is compared here with the same seeded episodes over HTTP act.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import msgpack
import pytest
from plain_http import HTTP
from server_process import ServerProcess
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "docs")]

from doc_blocks import REPO, runnable_blocks  # noqa: E402
from openpi_venv import openpi_python  # noqa: E402

pytestmark = pytest.mark.e2e

MODEL = "cartpole"
MAX_UNREADABLE = 3
PLAYER = Path(__file__).resolve().parent / "openpi_play.py"


@pytest.fixture(scope="module")
def python() -> Path:
    return openpi_python()  # made by .ci/run in the background; ~45 s here otherwise


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess({"RLSERVE_OPENPI_MODEL": MODEL, "RLSERVE_STREAM_MAX_UNREADABLE": str(MAX_UNREADABLE),
                          "RLSERVE_ACCESS_LOG": "all"}).start()
    try:
        yield proc
    finally:
        proc.terminate()


@pytest.fixture(scope="module")
def played(server, python) -> dict:
    ws = server.url.replace("http", "ws", 1)
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    done = subprocess.run([str(python), str(PLAYER), f"{ws}/v1/models/{MODEL}/openpi?seed=7&explore=true", host, port],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _http_episode(url: str, episode: dict) -> list[tuple[int, float]]:
    session, out = uuid.uuid4().hex, []
    with httpx.Client(base_url=url) as http:
        for i, step in enumerate(episode["steps"]):
            body = {"observation": step["observation"], "session_id": session, "explore": True}
            body.update({"episode_start": True, "seed": episode["seed"]} if i == 0 else {"reward": 1.0})
            answer = http.post(f"/v1/models/{MODEL}/act", json=body).json()
            out.append((answer["action"], answer["logp"]))
    return out


def test_openpi_client_plays_whole_episodes_on_one_connection(played):
    meta = played["metadata"]
    assert (meta["model"], meta["observation_key"], meta["action_space"]["type"]) == (MODEL, "observation", "Discrete")
    assert meta["observation_space"]["shape"] == [4]
    episodes = played["episodes"]
    assert [e["ended"] in ("terminated", "truncated", "max_steps") for e in episodes] == [True, True]
    assert all(len(e["steps"]) >= 10 for e in episodes)
    sessions = {s["session_id"] for e in episodes for s in e["steps"]}
    assert sessions == {meta["session_id"]}  # the connection is one session, episode after episode
    assert all(s["infer_ms"] > 0 for e in episodes for s in e["steps"])


def test_a_seeded_episode_over_openpi_is_the_http_episode(played, server):
    for episode in played["episodes"]:  # the second started by episode_start + seed in the dict
        got = [(s["action"], s["logp"]) for s in episode["steps"]]
        assert got == _http_episode(server.url, episode)
    first, second = played["episodes"]
    assert _http_episode(server.url, {**first, "seed": 99}) != [(s["action"], s["logp"]) for s in first["steps"]]


def test_bad_observations_are_error_strings_and_the_connection_goes_on(played, server):
    missing, shape = played["missing"], played["shape"]
    assert (missing["status"], missing["error"]["field"]) == (400, "observation")
    assert "'observation'" in missing["error"]["message"] and "state" in missing["error"]["received"]
    assert (shape["status"], shape["error"]["field"]) == (422, "observation")
    assert "shape [4]" in shape["error"]["message"]
    assert played["after"] in (0, 1)
    assert HTTP.get(f"{server.url}/healthz").status_code == 200


def test_the_root_path_speaks_openpi_for_the_configured_model(played):
    assert played["root_metadata"]["model"] == MODEL and played["root_action"] in (0, 1)


def test_unreadable_frames_close_with_1008_after_the_limit(server):
    with connect(server.url.replace("http", "ws", 1) + f"/v1/models/{MODEL}/openpi") as ws:
        assert msgpack.unpackb(ws.recv(timeout=10))["model"] == MODEL  # the metadata, first
        ws.send("not msgpack")  # a text frame: openpi sends binary only
        ws.send(b"\xc1")
        ws.send(msgpack.packb([1, 2]))
        errors = [json.loads(ws.recv(timeout=10)) for _ in range(MAX_UNREADABLE)]
        assert [e["status"] for e in errors] == [400] * MAX_UNREADABLE
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


def test_the_documented_example_runs_in_the_client_environment(server, python):
    """docs/api.md's openpi example is exempt from the doc runner (it needs this environment):
    it runs here as written, against this server."""
    blocks = [b for b in runnable_blocks(REPO / "docs" / "api.md") if "openpi_client" in b.text]
    assert len(blocks) == 1 and blocks[0].not_run == "openpi" and blocks[0].output is not None
    done = subprocess.run([str(python), "-c", blocks[0].text], capture_output=True, text=True, timeout=120,
                          env={"RLSERVE_URL": server.url, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == blocks[0].output.split()
