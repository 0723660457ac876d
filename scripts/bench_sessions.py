"""Benchmark sessions in the external store and --workers scaling (not a test: it prints numbers).

Three measurements, side by side in one run, with the load generator of bench_server.py
(closed loop, N keep-alive connections, its own process):

1. LSTM(256) sessions at c=64, one worker: the in-process store vs Redis (over its unix
   socket and over TCP), both cache modes (validate: a WATCH and a read script sent with
   each batch, a transaction after it; trust: the write script only). Target: Redis >= 0.7x
   in-process.
2. Single-observation MLP requests, one worker vs ``--workers 2`` (with the external store
   configured), against the minimal ASGI app on one vs two uvicorn workers. Target: the
   rlserve 2/1 ratio >= 0.9x the minimal app's 2/1 ratio.
3. The memory of idle LSTM(256) sessions in Redis, from ``INFO memory``: records are
   written with the server's own encoder and key scheme (pipelined SET with the idle TTL),
   and one written through the server is checked to be the same size.

Each ratio is measured in interleaved rounds (A then B, B then A, ...) with both servers
up, and every round's ratio is printed: the machine is shared and its load drifts.

Where processes run (measurement 1): with two or more CPUs, every server is pinned to CPU 0
and the load generator and redis-server to CPU 1, as bench_server.py pins servers and its
load generator, so that redis-server does not take CPU time from the server it is measured
against (a deployment gives Redis cores of its own, often another host). ``--no-pin``
leaves all three to the scheduler on the shared cores. Measurement 2 is never pinned: its
second worker needs the second core.

    python scripts/bench_sessions.py [--duration 4] [--rounds 5] [--idle-sessions 1000000] [--no-pin]

Needs redis-server on PATH and the [redis] extra.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

import bench_server  # noqa: E402
from bench_report import machine_line  # noqa: E402
from bench_server import (  # noqa: E402
    MINIMAL_APP,
    build_bundles,
    free_port,
    lstm_sessions,
    mlp_single,
    run_load,
    start_rlserve,
    stop,
    wait_ready,
)


def start_redis(workdir: Path) -> tuple[subprocess.Popen, int, Path]:
    workdir.mkdir(parents=True, exist_ok=True)
    port, sock = free_port(), workdir / "redis.sock"
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
                             "--save", "", "--appendonly", "no", "--unixsocket", str(sock), "--unixsocketperm", "700",
                             "--logfile", str(workdir / "redis.log")])
    import redis

    client = redis.Redis(unix_socket_path=str(sock))
    for _ in range(200):
        try:
            if client.ping():
                return proc, port, sock
        except redis.exceptions.ConnectionError:
            time.sleep(0.05)  # polling interval while it starts
    raise RuntimeError("redis-server did not start")


def start_minimal(workdir: Path, workers: int) -> tuple[subprocess.Popen, int]:
    (workdir / "minimal_app.py").write_text(MINIMAL_APP)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "minimal_app:app", "--port", str(port),
                             "--workers", str(workers), "--log-level", "warning", "--no-access-log"], cwd=workdir)
    wait_ready(port, "/", proc)
    return proc, port


def load(port: int, make, c: int, args, rng, pid: int | None = None) -> dict:
    before = bench_server.tree_cpu_seconds(pid) if pid else 0.0
    result = run_load(port, make(c, rng), args.duration, args.warmup)
    if pid:
        result["cpu_us"] = 1e6 * (bench_server.tree_cpu_seconds(pid) - before) / max(1, result["requests"])
    return result


def paired(label: str, a: tuple[int, int], b: tuple[int, int], make, c: int, args, rng, target: float,
           a_make=None, b_make=None) -> list[float]:
    """Rounds of (a, b) back to back, alternating the order; prints req/s of each and the ratio a/b."""
    ratios = []
    print(f"\n{label} (c={c}, {args.rounds} rounds of {args.duration:g} s a side)")
    for i in range(args.rounds):
        got = {}
        for side in (("a", "b") if i % 2 == 0 else ("b", "a")):
            port, pid = a if side == "a" else b
            got[side] = load(port, (a_make or make) if side == "a" else (b_make or make), c, args, rng, pid)
        ratio = got["a"]["req_s"] / got["b"]["req_s"]
        ratios.append(ratio)
        print(f"  round {i + 1}: {got['a']['req_s']:8.0f} vs {got['b']['req_s']:8.0f} req/s  ratio {ratio:.2f}  "
              f"p99 {got['a']['p99_ms']:.2f} vs {got['b']['p99_ms']:.2f} ms  errors {got['a']['errors']}/"
              f"{got['b']['errors']}", flush=True)
    print(f"  median {statistics.median(ratios):.2f} (target >= {target}), rounds meeting it "
          f"{sum(r >= target for r in ratios)}/{len(ratios)}")
    return ratios


# --------------------------------------------------------------------------- memory

def idle_memory(redis_sock: Path, sessions: int, batch: int = 10_000) -> dict:
    import numpy as np
    import redis

    from rlserve.models.interface import ModelSignature, StateSpec
    from rlserve.service.sessions.record import SessionLayout, encode_sessions
    from rlserve.service.sessions.redis_client import RedisSessions
    from rlserve.service.sessions.store import Session

    client = redis.Redis(unix_socket_path=str(redis_sock))
    client.flushall()
    signature = ModelSignature(obs_shape=(16,), num_outputs=4, state=(StateSpec("h", (256,)), StateSpec("c", (256,))))
    layout = SessionLayout(signature)
    keys = RedisSessions(f"unix://{redis_sock}").for_model("lstm")  # the server's key scheme
    before = client.info("memory")["used_memory"]
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    for first in range(0, sessions, batch):
        n = min(batch, sessions - first)
        group = [Session(f"{first + i:032x}", 0, None, None, 0.0, 0.0, steps=37) for i in range(n)]
        rows = [rng.standard_normal((n, 256)).astype(np.float32) for _ in range(2)]
        records = encode_sessions(layout, "1", group, [int(x) for x in rng.integers(0, 2**63, n)], rows, now=0.0)
        pipe = client.pipeline(transaction=False)
        for session, record in zip(group, records, strict=True):
            pipe.set(keys.key(session.id), record, px=600_000)
        pipe.execute()
    elapsed = time.perf_counter() - started
    info = client.info("memory")
    used = info["used_memory"] - before
    return {"sessions": sessions, "record_bytes": len(records[0]), "key_bytes": len(keys.key(group[0].id)),
            "used_memory": used, "per_session": used / sessions, "ratio": used / sessions / 2048,
            "rss": info["used_memory_rss"], "write_s": elapsed, "allocator": info.get("mem_allocator")}


def server_record_size(port: int, redis_sock: Path) -> int:
    """The size of one LSTM(256) session record the server itself wrote."""
    import redis

    body = json.dumps({"observation": [0.0] * 16, "session_id": "probe", "episode_start": True}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models/lstm/act", data=body,
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()
    return redis.Redis(unix_socket_path=str(redis_sock)).strlen("rlserve:s:4:lstm:probe")


# --------------------------------------------------------------------------- main

def main() -> None:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--idle-sessions", type=int, default=1_000_000)
    parser.add_argument("--only", nargs="+", choices=["store", "workers", "memory"], default=None)
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=(os.cpu_count() or 1) >= 2,
                        help="store ratios: servers on CPU 0, load generator and redis-server on CPU 1 "
                             "(default with >= 2 CPUs)")
    args = parser.parse_args()
    wanted = set(args.only or ["store", "workers", "memory"])
    rng = np.random.default_rng(0)
    c = args.concurrency
    print(machine_line())
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        repo = work / "repo"
        build_bundles(repo)
        redis_proc, redis_port, redis_sock = start_redis(work / "redis")
        unix_url = f"unix://{redis_sock}"
        tcp_url = f"redis://127.0.0.1:{redis_port}/0"
        servers: list[subprocess.Popen] = []
        try:
            if "store" in wanted:
                all_cpus = os.sched_getaffinity(0)
                if args.pin:
                    bench_server.SERVER_CPUS, bench_server.LOAD_CPUS = {0}, {1}
                    os.sched_setaffinity(redis_proc.pid, {1})
                placement = "servers on CPU 0, load generator and redis-server on CPU 1" if args.pin else "none"
                print(f"\nstore ratios, pinned: {placement}")
                inproc = start_rlserve(repo, {})
                external = {name: start_rlserve(repo, {"RLSERVE_SESSION_STORE": url, "RLSERVE_SESSION_CACHE": mode})
                            for name, url, mode in [("unix validate", unix_url, "validate"),
                                                    ("unix trust", unix_url, "trust"),
                                                    ("tcp validate", tcp_url, "validate")]}
                servers += [inproc[0], *(p for p, _ in external.values())]
                for name, (proc, port) in external.items():
                    paired(f"LSTM(256) sessions, Redis over {name} / in-process", (port, proc.pid),
                           (inproc[1], inproc[0].pid), lstm_sessions, c, args, rng, 0.7)
                for proc in servers:
                    stop(proc)
                servers.clear()
                bench_server.SERVER_CPUS = bench_server.LOAD_CPUS = None
                os.sched_setaffinity(redis_proc.pid, all_cpus)
            if "workers" in wanted:
                store_env = {"RLSERVE_SESSION_STORE": unix_url}
                one = start_rlserve(repo, store_env)
                two = start_rlserve(repo, {**store_env, "RLSERVE_WORKERS": "2"})
                min_one = start_minimal(work, 1)
                min_two = start_minimal(work, 2)
                servers += [one[0], two[0], min_one[0], min_two[0]]
                minimal = [[b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"] for _ in range(c)]
                rl = paired("MLP 1 obs, rlserve --workers 2 / 1 worker", (two[1], two[0].pid), (one[1], one[0].pid),
                            mlp_single, c, args, rng, 0.0)
                mn = paired("minimal ASGI app, 2 uvicorn workers / 1", (min_two[1], min_two[0].pid),
                            (min_one[1], min_one[0].pid), lambda c, rng: minimal, c, args, rng, 0.0)
                relative = [a / b for a, b in zip(rl, mn, strict=True)]
                print(f"\nrlserve scaling / minimal app scaling per round: {' '.join(f'{r:.2f}' for r in relative)}"
                      f"  median {statistics.median(relative):.2f} (target >= 0.9)")
                print("  (one and two workers on a 2-core machine that also runs the load generator)")
                for proc in servers:
                    stop(proc)
                servers.clear()
            if "memory" in wanted:
                proc, port = start_rlserve(repo, {"RLSERVE_SESSION_STORE": unix_url})
                servers.append(proc)
                size = server_record_size(port, redis_sock)
                stop(proc)
                servers.clear()
                mem = idle_memory(redis_sock, args.idle_sessions)
                print(f"\nidle LSTM(256) sessions in Redis ({mem['allocator']}): {mem['sessions']:,} written in "
                      f"{mem['write_s']:.1f} s")
                print(f"  record {mem['record_bytes']} bytes (one the server wrote: {size} bytes), "
                      f"key {mem['key_bytes']} bytes")
                print(f"  used_memory +{mem['used_memory'] / 2**20:.1f} MiB = {mem['per_session']:.0f} bytes/session "
                      f"= {mem['ratio']:.2f}x the 2,048 raw state bytes (target <= 1.5); "
                      f"for 1M sessions: {mem['per_session'] * 1e6 / 2**30:.2f} GiB")
        finally:
            for proc in servers:
                stop(proc)
            stop(redis_proc)


if __name__ == "__main__":
    socket.setdefaulttimeout(30)
    main()
