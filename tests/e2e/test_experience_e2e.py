"""The experience log end to end: real `rlserve serve` processes, the Python client,
gymnasium episodes of the embedded policies, the Parquet read back with pyarrow.

- 20 episodes (10 MLP, 10 LSTM) through one server: every transition rebuilt exactly.
- Two replicas sharing a real redis-server, steps alternating between them, one replica
  killed with SIGKILL mid-episode (after its rows were written) and restarted: episodes
  still whole and exact, joined from both replicas' segments.
- A full disk (a 256 KiB tmpfs; as root) or a folder that stops being one: serving goes
  on with no failed request and the dropped rows are counted.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from experience_play import Episode, assert_logged_exactly, play_all
from plain_http import HTTP
from server_process import ServerProcess

from rlserve.client.policy_client import PolicyClient
from rlserve.service.experience import reader

pytestmark = pytest.mark.e2e

MAX_STEPS = 60  # the client truncates longer episodes: both ends are exercised
GRACEFUL = (0, -signal.SIGTERM)


def _episodes(count: int, model: str, prefix: str, first_seed: int = 0, tight: int | None = None) -> list[Episode]:
    """``tight`` of them (default half) in a CartPole whose pole may lean a little only
    (they terminate), the others in the usual one (the client truncates them at ``MAX_STEPS``)."""
    tight = count // 2 if tight is None else tight
    return [Episode(model, f"{prefix}-{model}-{i}", first_seed + i, MAX_STEPS, tight=i < tight)
            for i in range(count)]


def test_twenty_episodes_of_both_policies_are_logged_exactly(tmp_path):
    log = tmp_path / "log"
    server = ServerProcess({"RLSERVE_EXPERIENCE_LOG": str(log)}).start()
    try:
        episodes = _episodes(10, "cartpole", "mlp") + _episodes(10, "cartpole-memory", "lstm")
        clients = {m: PolicyClient(server.url, m) for m in ("cartpole", "cartpole-memory")}
        played = play_all(episodes, lambda e: (clients[e.played.model], 0))
        # SIGTERM: the shutdown writes what the log holds (uvicorn re-raises the signal after it).
        assert server.terminate() in GRACEFUL
    finally:
        server.stop()
    assert {p.end for p in played} == {"terminated", "truncated"}
    assert_logged_exactly(log, played)


def _written(log: Path, model: str) -> set[str]:
    """Event ids on disk in both forms: a roll writes the transitions, then the episodes'
    segments, so a replica killed between the two writes loses the segments (that episode
    is then not whole, as documented). Killing only once both hold a step closes the window."""
    table = reader.transitions(log, model)
    if table is None:
        return set()
    transitions = {info["event_id"] for info in table.column("infos").to_pylist()}
    segments = {event for episode in reader.episodes(log, model) for event in episode.event_ids}
    return transitions & segments


def test_episodes_moving_between_replicas_and_a_killed_replica_stay_whole(tmp_path, redis_server):
    log = tmp_path / "log"
    env = {"RLSERVE_EXPERIENCE_LOG": str(log), "RLSERVE_SESSION_STORE": redis_server.url,
           "RLSERVE_EXPERIENCE_ROLL_S": "0.2"}  # rows reach disk within ~0.25 s
    servers = [ServerProcess(env), ServerProcess(env)]
    for server in servers:
        server.start(wait=False)
    for server in servers:
        server.wait_ready()
    clients = [PolicyClient(s.url, "cartpole-memory") for s in servers]
    episodes = _episodes(8, "cartpole-memory", "moving", first_seed=100, tight=2)

    def closed_by(server: int) -> set[str]:
        """Event ids of the steps whose transition ``server`` closed (it served the next one)."""
        return {p.event_ids[t] for p in (e.played for e in episodes)
                for t in range(len(p.event_ids)) if t + 1 < len(p.servers) and p.servers[t + 1] == server}

    def kill_once_written(round_: int) -> None:
        if round_ != 10:
            return
        deadline = time.monotonic() + 30
        while not closed_by(0) <= _written(log, "cartpole-memory"):  # the loss window, closed
            assert time.monotonic() < deadline, "replica 0 did not write its rows"
            time.sleep(0.05)
        servers[0].kill()  # SIGKILL between two steps: nothing of it shuts down
        servers[0].start()  # same port, nothing cached: its sessions come from Redis

    try:
        # Step t of every episode goes to replica t % 2: no replica holds a session two steps running.
        played = play_all(episodes, lambda e: (clients[e.t % 2], e.t % 2), pause=kill_once_written)
        for server in servers:
            assert server.terminate() in GRACEFUL
    finally:
        for server in servers:
            server.stop()
    assert sum(len(p) > 10 for p in played) >= 6  # these went on after the kill
    assert {p.end for p in played} == {"terminated", "truncated"}
    assert_logged_exactly(log, played)


def _mount_tmpfs(folder: Path, size: str) -> bool:
    folder.mkdir(parents=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True).returncode == 0


def _dropped(url: str) -> float:
    text = HTTP.get(f"{url}/metrics").text
    match = re.search(r'^rlserve_experience_dropped_total\{reason="write_failed"\} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


def test_a_full_or_failing_disk_drops_rows_and_fails_no_request(tmp_path):
    log = tmp_path / "small"
    full_disk = _mount_tmpfs(log, "256k")
    server = ServerProcess({"RLSERVE_EXPERIENCE_LOG": str(log), "RLSERVE_EXPERIENCE_ROLL_S": "0.1"}).start()
    sessions = [f"d{i}" for i in range(32)]
    failed = 0
    try:
        with httpx.Client(base_url=server.url) as client:
            body = {"observations": [[0.01, 0.0, 0.02, 0.0]] * 32, "session_ids": sessions,
                    "episode_starts": [True] * 32}
            for t in range(150):
                if t == 20 and not full_disk:  # no tmpfs here: the folder stops being one
                    shutil.rmtree(log)
                    log.write_text("not a folder")
                answer = client.post("/v1/models/cartpole/act", json=body)
                failed += answer.status_code != 200
                body = {"observations": [[0.01 * (t % 7), 0.0, 0.02, 0.0]] * 32, "session_ids": sessions,
                        "rewards": [1.0] * 32}
            deadline = time.monotonic() + 20
            while _dropped(server.url) == 0:
                assert time.monotonic() < deadline, "no dropped rows counted"
                time.sleep(0.1)
            assert client.post("/v1/models/cartpole/act", json=body).status_code == 200
        assert server.terminate() in GRACEFUL
        assert "experience log: dropped" in server.output()
    finally:
        server.stop()
        if full_disk:
            subprocess.run(["umount", str(log)], check=False)
    assert failed == 0
    if full_disk:  # what did fit was written whole: every file there reads
        for path in log.rglob("*.parquet"):
            assert reader.pq.read_table(path).num_rows > 0
