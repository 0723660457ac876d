"""Benchmark the real server over loopback (not a test: it prints numbers).

Starts ``rlserve serve`` in a subprocess (one uvicorn worker) on bundles it builds with
the catalog, and a minimal ASGI app returning fixed JSON, then drives each with a bounded
closed-loop load generator (N keep-alive connections, one request in flight each) and
prints req/s, obs/s, p50 and p99 per scenario and concurrency:

    minimal ASGI app | MLP 256x256 single obs | LSTM sessions | LSTM without sessions |
    64-obs requests (JSON lists) | 64-obs requests as one raw binary body |
    64-obs requests over the Open Inference Protocol's binary tensor extension |
    MLP single obs with batching off | MLP single obs through the raw ASGI handler

``rlserve serve`` answers act requests inside uvicorn's HTTP protocol (service/act_protocol.py);
the last scenario turns that off (RLSERVE_ACT_PROTOCOL=false) to show what the ASGI path costs.

    python scripts/bench_server.py [--duration 5] [--concurrency 1 16 64] [--only mlp lstm]
    python scripts/bench_server.py --duration 3 --paired 7 --baseline ../before-checkout   # the docs' run

With two or more CPUs every server is pinned to CPU 0 and the load generator to CPU 1
(``--no-pin`` turns that off). ``--baseline DIR`` serves the same bundles from another
checkout of rlserve too (its ``models/`` and ``service/``) and prints a before/after table
of the same run, each scenario alternating the two servers. The run starts and ends with
the machine's state (time, CPU model, ``nproc``, load averages, commit).

The load generator runs in its own process (uvloop, raw sockets, pre-encoded requests)
so its cost is small and separate from the server's; on a 2-core machine they still share
the cores, as a co-located client would.

The bundles and each scenario's requests are in bench_scenarios.py; the machine line, the
results file, the before/after table and the targets in bench_report.py. This module keeps
the servers, the load generator and the runs, and re-exports those names for the scripts
that import it (bench_agents.py, bench_gpu.py, bench_frames.py, ...).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
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
sys.path.insert(0, str(ROOT))

from bench_procs import tree_cpu_seconds  # noqa: E402  (re-exported: bench_sessions.py uses it)
from bench_report import BINARY_TARGET, compare, machine_state, summarize, write_results  # noqa: E402
from bench_scenarios import (  # noqa: E402, F401  (re-exported: other bench scripts import them from here)
    KEYS,
    OBS_PER_REQUEST,
    SCENARIOS,
    _request,
    act_binary64,
    build_bundles,
    infer_binary64,
    lstm_sessions,
    lstm_stateless,
    minimal,
    mlp_batch64,
    mlp_single,
    obs_row,
)
from bench_ws import ws_connection  # noqa: E402

MINIMAL_APP = '''
import orjson
BODY = orjson.dumps({"action": 1, "logp": -0.69})
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]})
    await send({"type": "http.response.body", "body": BODY})
'''


# --------------------------------------------------------------------------- servers

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port: int, path: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.05)  # polling interval while the process starts, not a readiness guess
    raise RuntimeError("server did not become ready")


SERVER_CPUS: set[int] | None = None  # set by --pin: where servers run
LOAD_CPUS: set[int] | None = None  # and where the load generator runs


def _pinned() -> None:
    if SERVER_CPUS is not None:
        os.sched_setaffinity(0, SERVER_CPUS)


def start_rlserve(repo: Path, env_extra: dict[str, str], code_root: Path | None = None) -> tuple[subprocess.Popen, int]:
    """``code_root``: a directory whose ``rlserve`` package links to another checkout
    (``--baseline``); it goes first on the server's path."""
    port = free_port()
    path = str(ROOT) if code_root is None else f"{code_root}{os.pathsep}{ROOT}"
    env = {**os.environ, "PYTHONPATH": path, "RLSERVE_LOG_LEVEL": "warning", **env_extra}
    # The command line's entry point: the same call in every checkout a baseline may be.
    code = "import sys; from rlserve.service.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, "serve", "--repository", str(repo), "--port", str(port)],
                            env=env,
                            preexec_fn=_pinned)
    wait_ready(port, "/readyz", proc)
    return proc, port


def baseline_root(checkout: Path, workdir: Path) -> Path:
    """A path entry whose ``rlserve`` namespace package is ``checkout``'s code (found
    before the installed editable package, which is only a meta path finder)."""
    root = workdir / "baseline-path"
    pkg = root / "rlserve"
    pkg.mkdir(parents=True)
    for name, target in (("models", "models"), ("service", "service"), ("client", "service/client")):
        (pkg / name).symlink_to((checkout / target).resolve())
    return root


def start_minimal(workdir: Path, app: str = MINIMAL_APP, env: dict[str, str] | None = None
                  ) -> tuple[subprocess.Popen, int]:
    """uvicorn serving ``app`` (the source of a module with an ASGI ``app``), with ``env``
    added to this process's environment."""
    (workdir / "minimal_app.py").write_text(app)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "minimal_app:app", "--port", str(port),
                             "--log-level", "warning", "--no-access-log"], cwd=workdir, preexec_fn=_pinned,
                            env=None if env is None else {**os.environ, **env})
    wait_ready(port, "/", proc)
    return proc, port


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


# --------------------------------------------------------------------------- load generator

async def _read_chunks(reader: asyncio.StreamReader) -> bytes:
    """A chunked body, up to its last (empty) chunk and the blank line after it."""
    parts = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailer fields, if any
                pass
            return b"".join(parts)
        parts.append((await reader.readexactly(size + 2))[:-2])


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP/1.1 answer on a keep-alive connection: its status and its body (by its
    content-length, or chunked, as Ray Serve's proxy answers)."""
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            return int(head[9:12]), await reader.readexactly(int(line[15:]))
    if b"transfer-encoding: chunked" in head.lower():
        return int(head[9:12]), await _read_chunks(reader)
    raise RuntimeError(f"response without content-length: {head!r}")


async def _connection(port: int, requests: list[bytes], stop_at: float, warm_until: float,
                      latencies: list[float], errors: list[int], total: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    i = 0
    while True:
        now = time.perf_counter()
        if now >= stop_at:
            break
        writer.write(requests[i % len(requests)])
        i += 1
        status, _ = await read_answer(reader)
        done = time.perf_counter()
        total[0] += 1
        # Only answers inside the measured window count: a request still in flight at its
        # end would add up to one request per connection, which is much when a request
        # takes a good part of the window (a 1,024-image batch on the CPU).
        if warm_until < done <= stop_at:
            latencies.append(done - now)
            if status != 200:
                errors.append(status)
    writer.close()


def _load_process(port: int, requests_per_conn: list[list[bytes]], duration: float, warmup: float, queue,
                  cpus: set[int] | None = None, stream: bool = False) -> None:
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass

    async def main() -> tuple[list[float], list[int], int]:
        latencies: list[float] = []
        errors: list[int] = []
        total = [0]
        start = time.perf_counter()
        warm_until, stop_at = start + warmup, start + warmup + duration
        connection = ws_connection if stream else _connection
        await asyncio.gather(*(connection(port, reqs, stop_at, warm_until, latencies, errors, total)
                               for reqs in requests_per_conn))
        return latencies, errors, total[0]

    try:
        queue.put(asyncio.run(main()))
    except BaseException as exc:  # the parent must not wait forever on a dead generator
        queue.put(exc)
        raise


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_load(port: int, requests_per_conn: list[list[bytes]], duration: float, warmup: float,
             server_pid: int | None = None, stream: bool = False) -> dict:
    """A closed-loop load of HTTP requests, or (``stream``) of a stream's frames after its
    upgrade (``_ws_connection``); latencies, errors and the server's CPU per request."""
    queue = mp.get_context("spawn").Queue()
    proc = mp.get_context("spawn").Process(
        target=_load_process, args=(port, requests_per_conn, duration, warmup, queue, LOAD_CPUS, stream)
    )
    cpu_before = tree_cpu_seconds(server_pid) if server_pid else 0.0
    proc.start()
    result = queue.get()
    proc.join()
    cpu_used = (tree_cpu_seconds(server_pid) - cpu_before) if server_pid else 0.0
    if isinstance(result, BaseException):
        raise RuntimeError("load generator failed") from result
    latencies, errors, total = result
    latencies.sort()
    n = len(latencies)
    return {
        "requests": n,
        "req_s": n / duration,
        "p50_ms": 1e3 * latencies[n // 2] if n else float("nan"),
        "p99_ms": 1e3 * latencies[min(n - 1, int(n * 0.99))] if n else float("nan"),
        "mean_ms": 1e3 * statistics.fmean(latencies) if n else float("nan"),
        "errors": len(errors),
        # Server CPU per request (warm-up included on both sides; the server's whole process
        # tree): less sensitive than req/s to other load on a shared machine.
        "cpu_us": 1e6 * cpu_used / total if total else float("nan"),
    }


def timing_options(parser: argparse.ArgumentParser, duration: float, rounds: int) -> None:
    """The options of a run of rounds: seconds per point, warm-up, rounds, concurrencies."""
    parser.add_argument("--duration", type=float, default=duration)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])


def measure(port: int, make, c: int, rng, args, pid: int) -> dict:
    runs = [run_load(port, make(c, rng), args.duration, args.warmup, pid) for _ in range(args.repeat)]
    res = dict(sorted(runs, key=lambda r: r["req_s"])[len(runs) // 2])
    # CPU per request is the steadier figure on a shared machine: its own median.
    res["cpu_us"] = statistics.median(r["cpu_us"] for r in runs)
    return res


def show(label: str, c: int, res: dict, obs: int) -> None:
    print(f"{label:<44} c={c:<3} {res['req_s']:>9.0f} req/s {res['req_s'] * obs:>10.0f} obs/s "
          f"p50 {res['p50_ms']:6.2f} ms  p99 {res['p99_ms']:6.2f} ms  "
          f"server cpu {res['cpu_us']:6.1f} us/req  errors {res['errors']}", flush=True)


def main() -> None:
    import numpy as np

    global SERVER_CPUS, LOAD_CPUS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--only", nargs="+", default=None,
                        choices=KEYS)
    parser.add_argument("--repeat", type=int, default=1,
                        help="run each point this many times and report the median req/s and, separately, "
                             "the median server CPU per request (the machine is shared)")
    parser.add_argument("--env", nargs="*", default=[], help="extra RLSERVE_X=Y settings for the server")
    parser.add_argument("--paired", type=int, default=0, metavar="ROUNDS",
                        help="after the table, measure the ratio targets in ROUNDS interleaved pairs "
                             "(both servers up, A B then B A, ...) and print each pair's ratio: on a shared "
                             "machine load bursts move a whole scenario, and pairing cancels most of that")
    parser.add_argument("--baseline", type=Path, default=None, metavar="CHECKOUT",
                        help="another rlserve checkout (e.g. a git worktree of the commit before a change): "
                             "the table shows it and this one side by side, alternating, on the same bundles")
    parser.add_argument("--json", type=Path, default=None, metavar="RESULTS",
                        help="also write the table's numbers to RESULTS (scripts/bench_results.py's format, "
                             "what scripts/plot_benchmarks.py plots)")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=(os.cpu_count() or 1) >= 2,
                        help="servers on CPU 0, the load generator on CPU 1 (default with >= 2 CPUs)")
    args = parser.parse_args()
    if args.pin:
        SERVER_CPUS, LOAD_CPUS = {0}, {1}
    wanted = set(args.only or KEYS)
    extra_env = dict(kv.split("=", 1) for kv in args.env)
    rng = np.random.default_rng(0)

    machine_state("start")
    print(f"pinned: {'servers on CPU 0, load generator on CPU 1' if args.pin else 'no'}; "
          f"{args.duration:g} s per point after {args.warmup:g} s warm-up", flush=True)
    print(f"server settings: {' '.join(args.env) if args.env else 'defaults'}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        t0 = time.time()
        build_bundles(repo)
        print(f"bundles built in {time.time() - t0:.1f}s", flush=True)
        base = None if args.baseline is None else baseline_root(args.baseline, Path(tmp))
        rows: list[tuple[str, int, dict, int]] = []
        before: list[tuple[str, int, dict, int]] = []
        for key, label, make, env in SCENARIOS:
            if key not in wanted:
                continue
            obs = OBS_PER_REQUEST.get(key, 1)
            proc, port = start_minimal(Path(tmp)) if env is None else start_rlserve(repo, {**extra_env, **env})
            old = None
            try:
                if base is not None and env is not None:
                    old = start_rlserve(repo, {**extra_env, **env}, code_root=base)
                for i, c in enumerate(args.concurrency):
                    sides = [("after", proc, port)] + ([("before", *old)] if old else [])
                    for side, p, prt in (sides if i % 2 == 0 else sides[::-1]):
                        res = measure(prt, make, c, rng, args, p.pid)
                        (rows if side == "after" else before).append((key, c, res, obs))
                        show(f"{label}{' [before]' if side == 'before' else ''}", c, res, obs)
            finally:
                stop(proc)
                if old is not None:
                    stop(old[0])
        summarize(rows)
        if args.json is not None:
            write_results(args.json, rows, args)
        if before:
            compare(before, rows)
        if args.paired:
            pairs = [pair for pair in PAIRS if {pair[1], pair[2]} <= wanted]
            paired(repo, Path(tmp), extra_env, args.concurrency, args.paired, args.duration, args.warmup, rng,
                   pairs)
    machine_state("end")


PAIRS = [  # (label, numerator, denominator, target per concurrency (None: all), concurrencies (None: all))
    ("MLP 1 obs / minimal ASGI app", "mlp", "minimal", {1: 0.5, None: 0.8}, None),
    ("LSTM sessions / LSTM stateless", "lstm", "lstm_stateless", {None: 0.8}, None),
    ("64 obs: raw binary / JSON", "binary64", "batch64", {None: 1.0}, (16,)),
    ("64 obs: OIP binary / JSON", "infer64", "batch64", {None: 1.0}, (16,)),
]


def paired(repo: Path, workdir: Path, extra_env: dict[str, str], concurrencies: list[int], rounds: int,
           duration: float, warmup: float, rng, pairs: list) -> None:
    """The ratio targets from interleaved runs: both servers stay up and each round runs
    the two scenarios back to back (alternating which goes first), and the ratio of each
    round is reported (not a ratio of medians). Pairs of multi-row scenarios also print
    each side's median obs/s."""
    makers = {key: make for key, _, make, _ in SCENARIOS}
    minimal_proc, minimal_port = start_minimal(workdir)
    rlserve_proc, rlserve_port = start_rlserve(repo, extra_env)
    where = {key: (minimal_proc, minimal_port) if key == "minimal" else (rlserve_proc, rlserve_port)
             for key in makers}
    print(f"\npaired runs ({rounds} rounds of {duration:g} s each side, A then B, B then A, ...; "
          f"req/s ratio per round [server CPU ratio]):", flush=True)
    summary = []
    try:
        for c in concurrencies:
            for label, num, den, targets, only in pairs:
                if only is not None and c not in only:
                    continue
                target = targets.get(c, targets[None])
                ratios, cpu_ratios, obs_s = [], [], {num: [], den: []}
                for i in range(rounds):
                    got = {}
                    for key in ((num, den) if i % 2 == 0 else (den, num)):
                        proc, port = where[key]
                        got[key] = run_load(port, makers[key](c, rng), duration, warmup, proc.pid)
                    ratios.append(got[num]["req_s"] / got[den]["req_s"])
                    cpu_ratios.append(got[den]["cpu_us"] / got[num]["cpu_us"])
                    for key in (num, den):
                        obs_s[key].append(got[key]["req_s"] * OBS_PER_REQUEST.get(key, 1))
                met = sum(r >= target for r in ratios)
                median = statistics.median(ratios)
                print(f"  c={c:<3} {label:<32} median {median:.2f} "
                      f"[cpu {statistics.median(cpu_ratios):.2f}]  range {min(ratios):.2f}-{max(ratios):.2f}  "
                      f"rounds >= {target}: {met}/{rounds}  ({' '.join(f'{r:.2f}' for r in ratios)})", flush=True)
                line = (f"| {c} | {label} | {median:.2f} | {min(ratios):.2f}-{max(ratios):.2f} | {met}/{rounds} "
                        f"(>= {target}) | {' '.join(f'{r:.2f}' for r in ratios)} |")
                if OBS_PER_REQUEST.get(num, 1) > 1:
                    top, bottom = statistics.median(obs_s[num]), statistics.median(obs_s[den])
                    print(f"        median obs/s {num} {top:.0f}  {den} {bottom:.0f}  "
                          f"({num} >= {BINARY_TARGET}: {'yes' if top >= BINARY_TARGET else 'no'}; "
                          f"rounds: {' '.join(f'{x / 1000:.0f}k' for x in obs_s[num])})", flush=True)
                    line += f" {num} {top:,.0f} obs/s, {den} {bottom:,.0f} obs/s (medians) |"
                else:
                    line += " |"
                summary.append(line)
    finally:
        stop(minimal_proc)
        stop(rlserve_proc)
    print("\n| c | ratio | median of per-round ratios | range | rounds at target | each round | obs/s |")
    print("|---|---|---|---|---|---|---|")
    for line in summary:
        print(line)


if __name__ == "__main__":
    main()
