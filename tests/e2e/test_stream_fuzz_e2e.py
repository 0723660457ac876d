"""Hostile frames on real sockets to both streams of one real ``rlserve serve`` (seeded fuzzing).

The server serves ``cartpole-memory`` (the single-agent stream) and a policy set of the
embedded models (the multi-agent stream), with messages held to 16 KiB. A raw-socket
WebSocket client (``ws_raw``: frames written by hand) sends both routes malformed, truncated,
wrong-typed, binary-garbage, lying msgpack-numpy, deeply nested, fragmented (valid and not),
oversized and protocol-breaking messages (``fuzz_frames``), reading after each:

- every answer is one frame: an error frame with the JSON error body and a 4xx ``status``,
  or, for a message that is valid after all (fragmented, split UTF-8), its answer;
- every close is one of the documented codes (1000 after an ``end`` a wrong-typed message
  happened to carry, 1002 protocol error, 1007 invalid UTF-8, 1008 too many unreadable
  messages, 1009 too big), never 1011 or a dropped connection;
- between batches, two streams held open since the start and two new ones step normally;
- the server's RSS (``/proc/<pid>/status``) after all batches stays within ``RSS_BOUND`` of
  its RSS after the warm-up batch.

The seed is drawn afresh each run (``RLSERVE_FUZZ_SEED`` replays one) and printed; a
failure names it.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
from fuzz_frames import Hostile, hostile, valid
from server_process import ServerProcess
from ws_raw import CLOSE, PONG, RawSocket

from rlserve.client.agents_stream import AgentsStream
from rlserve.client.stream import Stream

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
MAX_BYTES = 16 * 1024
BATCHES, PER_BATCH = 8, 300  # after a warm-up batch: 2400 hostile messages
# Bytes the RSS may grow after the warm-up: the batches send ~10 MB of oversized and deep
# messages (none may be kept); the sessions and episodes their valid messages open stay (4.2 MiB
# measured on the 2-core development machine).
RSS_BOUND = 12 * 1024 * 1024
DOCUMENTED_CLOSES = {1000, 1002, 1007, 1008, 1009}
# Kinds whose messages may be valid steps: fragmented ones are, and a "wrong" value may fit (a tag of -1).
MAY_BE_VALID = {"fragmented", "fragmented_utf8", "wrong_type"}
ROUTES = {False: "/v1/models/cartpole-memory/stream", True: "/v1/models/team/agents/stream"}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    from rlserve.models.export.policy_set_export import policy_set_from_bundles
    from rlserve.models.multiagent.mapping import AgentMapping

    models = REPO / "service" / "default_models"
    team = tmp_path_factory.mktemp("stream_fuzz") / "team"
    with policy_set_from_bundles({"rnn": models / "cartpole-memory", "ff": models / "cartpole"}, team,
                                 AgentMapping({}, [("red_*", "rnn"), ("blue_*", "ff")], None), name="team"):
        pass
    process = ServerProcess({"RLSERVE_POLICY_SETS": json.dumps([str(team)]), "RLSERVE_MAX_BODY_BYTES": str(MAX_BYTES),
                             "RLSERVE_LOG_LEVEL": "critical"}, ["--repository", str(models)])
    try:
        yield process.start()
    finally:
        process.stop()


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _problem(message: Hostile, answer: tuple[int, bytes] | None) -> str | None:
    """What is wrong with the server's reply to ``message`` (None: nothing)."""
    if answer is None:
        return f"{message.kind}: the connection was dropped without a close frame"
    opcode, payload = answer
    if opcode == CLOSE:
        code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else None
        return None if code in DOCUMENTED_CLOSES else f"{message.kind}: close code {code}"
    if message.closes:
        return f"{message.kind}: answered instead of closed: {payload[:200]!r}"
    body = json.loads(payload) if opcode == 0x1 else msgpack.unpackb(payload)
    if "error" not in body:
        return None if message.kind in MAY_BE_VALID else f"{message.kind}: answered {body}"
    if not 400 <= body.get("status", 0) < 500 or set(body["error"]) != {"code", "message", "field", "expected",
                                                                          "received"}:
        return f"{message.kind}: error frame {body}"
    return None


def _too_large(answer: tuple[int, bytes]) -> bool:
    """The error frame (``payload_too_large``) an oversized message gets before its close."""
    opcode, payload = answer
    if opcode not in (0x1, 0x2):
        return False
    body = json.loads(payload) if opcode == 0x1 else msgpack.unpackb(payload)
    return isinstance(body, dict) and body.get("status") == 413


def _batch(port: int, rnd: random.Random, count: int) -> tuple[list[str], dict[str, int]]:
    """``count`` hostile messages, each route in turn; a closed connection is opened again."""
    problems: list[str] = []
    kinds: dict[str, int] = {}
    sockets: dict[bool, RawSocket | None] = {False: None, True: None}
    for i in range(count):
        agents = bool(i % 2)
        socket = sockets[agents] or RawSocket(port, ROUTES[agents])
        sockets[agents] = socket
        message = hostile(rnd, agents, MAX_BYTES)
        kinds[message.kind] = kinds.get(message.kind, 0) + 1
        sent = all(socket.write(data) for data in message.frames)
        answer = socket.read()
        while answer is not None and answer[0] == PONG:
            answer = socket.read()
        if message.closes and answer is not None and _too_large(answer):  # docs/api.md: 413 frame, then 1009
            answer = socket.read()
        problem = _problem(message, answer) if sent or answer is not None else None
        if problem:
            problems.append(problem)
        if answer is None or answer[0] == CLOSE:
            socket.close()
            sockets[agents] = None
    for socket in sockets.values():
        if socket is not None:
            socket.close()
    return problems, kinds


def _healthy(url: str, single: Stream, team: AgentsStream, rnd: random.Random) -> None:
    """Two streams open since the start and two new ones each answer a step."""
    with Stream(url, "cartpole-memory") as fresh, AgentsStream(url, "team") as fresh_team:
        for stream in (single, fresh):
            assert stream.step(valid(rnd, False)["observation"]).action in (0, 1)
        for stream in (team, fresh_team):
            step = valid(rnd, True)["agents"]
            assert set(stream.step(step).actions) == set(step)


def test_hostile_frames_get_error_frames_or_documented_closes_and_the_server_goes_on(server) -> None:
    seed = int(os.environ.get("RLSERVE_FUZZ_SEED") or random.SystemRandom().randrange(1 << 32))
    print(f"stream fuzz seed {seed} (RLSERVE_FUZZ_SEED={seed} replays it)")
    rnd = random.Random(seed)
    assert server.proc is not None
    pid, port = server.proc.pid, server.port
    with Stream(server.url, "cartpole-memory") as single, AgentsStream(server.url, "team") as team:
        _healthy(server.url, single, team, rnd)
        problems, _ = _batch(port, rnd, PER_BATCH)  # warm-up: the same kinds of allocations
        assert not problems, f"seed {seed}: {problems[:10]}"
        _healthy(server.url, single, team, rnd)
        warm = _rss(pid)
        seen: dict[str, int] = {}
        for _ in range(BATCHES):
            problems, kinds = _batch(port, rnd, PER_BATCH)
            assert not problems, f"seed {seed}: {problems[:10]}"
            _healthy(server.url, single, team, rnd)
            for kind, n in kinds.items():
                seen[kind] = seen.get(kind, 0) + n
        grown = _rss(pid) - warm
        print(f"RSS after warm-up {warm / 2**20:.1f} MiB, grew {grown / 2**20:.1f} MiB over "
              f"{BATCHES * PER_BATCH} hostile messages ({seen})")
        assert grown < RSS_BOUND, f"seed {seed}: RSS grew {grown} bytes"
        assert len(seen) == 13  # every kind was sent
