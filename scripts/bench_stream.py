"""Benchmark streams against HTTP act (not a test: it prints numbers).

One environment per connection, closed loop (one step in flight each), at concurrency 1,
16 and 64: HTTP/1.1 keep-alive act with a session id per environment, against a stream
(``/v1/models/{name}/stream``, JSON text frames) per environment, on the same server in the
same run, the two alternating in rounds. Printed per transport and concurrency: steps/s,
p50 and p99 round trip, and the server's CPU time per step (user + system of its process,
read from /proc before and after each round, warm-up included). The issue's targets: the
stream's p50 at most 0.5x HTTP's at c=1, its CPU per step at most 0.6x HTTP's at c=64.

Both clients are the same code: raw asyncio sockets with pre-encoded messages in a process
of their own (a WebSocket frame is written by hand, masked with a zero key), so neither
pays a client library's cost. With two or more CPUs the server is pinned to CPU 0 and the
load generator to CPU 1 (as bench_server.py does).

    python scripts/bench_stream.py [--duration 3] [--warmup 0.5] [--rounds 3] [--concurrency 1 16 64]
                                   [--model cartpole-memory] [--code CHECKOUT]

``--code CHECKOUT`` serves with another checkout's code (bench_server.py's ``--baseline``
path), so that runs of a change and of its parent can follow each other on one machine.

The server serves the embedded default models (``cartpole-memory`` is an LSTM policy).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from bench_procs import tree_cpu_seconds  # noqa: E402
from bench_server import _pinned, baseline_root, free_port, read_answer, stop, wait_ready  # noqa: E402
from bench_ws import ws_frame, ws_read  # noqa: E402

OBSERVATION = {"cartpole-memory": [0.01, -0.02], "cartpole": [0.01, -0.02, 0.03, 0.04]}


def start_server(code_root: Path | None = None) -> tuple[subprocess.Popen, int]:
    """``code_root``: a path entry whose ``rlserve`` is another checkout (``--code``)."""
    port = free_port()
    path = str(ROOT) if code_root is None else f"{code_root}{os.pathsep}{ROOT}"
    env = {**os.environ, "PYTHONPATH": path, "RLSERVE_LOG_LEVEL": "warning"}
    code = "import sys; from rlserve.service.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, "serve", "--port", str(port)], env=env, preexec_fn=_pinned)
    wait_ready(port, "/readyz", proc)
    return proc, port


# --------------------------------------------------------------------------- clients

async def _http_env(port: int, model: str, obs: list[float], stop_at: float, warm_until: float,
                    latencies: list[float], index: int) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    session = f"bench-{os.getpid()}-{index}"

    def request(body: dict) -> bytes:
        data = json.dumps(body).encode()
        return (f"POST /v1/models/{model}/act HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                f"content-length: {len(data)}\r\n\r\n").encode() + data

    first = request({"observation": obs, "session_id": session, "episode_start": True, "seed": index})
    step = request({"observation": obs, "session_id": session, "reward": 1.0})
    count, message = 0, first
    while (now := time.perf_counter()) < stop_at:
        writer.write(message)
        status, body = await read_answer(reader)
        if status != 200:
            raise RuntimeError(f"HTTP act refused: {status} {body[:200]!r}")
        if now >= warm_until:
            latencies.append(time.perf_counter() - now)
        count, message = count + 1, step
    writer.close()
    return count


async def _stream_env(port: int, model: str, obs: list[float], stop_at: float, warm_until: float,
                      latencies: list[float], index: int) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write((f"GET /v1/models/{model}/stream?seed={index} HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\n"
                  f"connection: Upgrade\r\nsec-websocket-key: {key}\r\nsec-websocket-version: 13\r\n\r\n").encode())
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 101"):
        raise RuntimeError(f"stream upgrade refused: {head[:200]!r}")
    message = ws_frame(json.dumps({"observation": obs, "reward": 1.0}).encode())
    count = 0
    while (now := time.perf_counter()) < stop_at:
        writer.write(message)
        answer = await ws_read(reader)
        if b'"error"' in answer:
            raise RuntimeError(f"stream step refused: {answer[:200]!r}")
        if now >= warm_until:
            latencies.append(time.perf_counter() - now)
        count += 1
    writer.close()
    return count


def _load(port: int, model: str, transport: str, c: int, duration: float, warmup: float, queue) -> None:
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    env = _http_env if transport == "http" else _stream_env

    async def run() -> tuple[int, list[float]]:
        start = time.perf_counter()
        latencies: list[float] = []
        counts = await asyncio.gather(*(env(port, model, OBSERVATION[model], start + warmup + duration,
                                            start + warmup, latencies, i) for i in range(c)))
        return sum(counts), latencies

    queue.put(asyncio.run(run()))


def measure(pid: int, port: int, model: str, transport: str, c: int, args) -> dict:
    queue: mp.Queue = mp.Queue()
    before = tree_cpu_seconds(pid)
    proc = mp.Process(target=_load, args=(port, model, transport, c, args.duration, args.warmup, queue))
    proc.start()
    steps, latencies = queue.get()
    proc.join()
    cpu = tree_cpu_seconds(pid) - before
    latencies.sort()
    return {"steps_s": len(latencies) / args.duration, "p50_ms": 1e3 * latencies[len(latencies) // 2],
            "p99_ms": 1e3 * latencies[int(len(latencies) * 0.99)], "cpu_us": 1e6 * cpu / max(1, steps)}


def machine() -> str:
    cpu = "?"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else ()
    return (f"machine: {platform.machine()} {cpu} nproc={os.cpu_count()} load={tuple(round(x, 2) for x in load)} "
            f"python={platform.python_version()} {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--model", default="cartpole-memory", choices=sorted(OBSERVATION))
    parser.add_argument("--code", type=Path, default=None, metavar="CHECKOUT",
                        help="serve with another checkout's code (its models and service)")
    args = parser.parse_args()
    print(machine() + ("" if args.code is None else f" code={args.code}"), flush=True)
    with tempfile.TemporaryDirectory(prefix="rlserve-bench-stream-") as tmp:
        code_root = None if args.code is None else baseline_root(args.code, Path(tmp))
        run(args, code_root)
    print(machine())


def run(args: argparse.Namespace, code_root: Path | None) -> None:
    proc, port = start_server(code_root)
    try:
        for c in args.concurrency:
            results: dict[str, list[dict]] = {"http": [], "stream": []}
            for r in range(args.rounds):  # alternating order: the machine's load drifts
                for transport in (("http", "stream") if r % 2 == 0 else ("stream", "http")):
                    results[transport].append(measure(proc.pid, port, args.model, transport, c, args))
            median = {t: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for t, rs in results.items()}
            for transport, m in median.items():
                print(f"c={c:<3} {transport:<6} {m['steps_s']:9.0f} steps/s  p50 {m['p50_ms']:7.3f} ms  "
                      f"p99 {m['p99_ms']:7.3f} ms  server CPU {m['cpu_us']:6.1f} us/step", flush=True)
            h, s = median["http"], median["stream"]
            print(f"c={c:<3} stream/http: p50 {s['p50_ms'] / h['p50_ms']:.2f}x  "
                  f"CPU/step {s['cpu_us'] / h['cpu_us']:.2f}x  steps/s {s['steps_s'] / h['steps_s']:.2f}x", flush=True)
    finally:
        stop(proc)


if __name__ == "__main__":
    main()
