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
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
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


# --------------------------------------------------------------------------- bundles

def build_bundles(repo: Path) -> None:
    import gymnasium.spaces as gs
    import numpy as np
    import torch

    from rlserve.models.catalog import build_model
    from rlserve.models.export.exporter import export_bundle

    torch.set_num_threads(1)
    obs = gs.Box(-1.0, 1.0, (16,), np.float32)
    act = gs.Discrete(4)
    configs = {
        "mlp": {"fcnet_hiddens": [256, 256]},
        "lstm": {"fcnet_hiddens": [256, 256], "use_lstm": True, "lstm_cell_size": 256},
    }
    for name, cfg in configs.items():
        torch.manual_seed(0)
        model = build_model(obs, act, cfg)
        export_bundle(model, obs_space=obs, action_space=act, model_config=cfg, out_dir=repo / name,
                      name=name, version="1", formats=["onnx"])


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
    code = "import sys; from rlserve.service.server import serve_main; sys.exit(serve_main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, "--repository", str(repo), "--port", str(port)], env=env,
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


def start_minimal(workdir: Path) -> tuple[subprocess.Popen, int]:
    (workdir / "minimal_app.py").write_text(MINIMAL_APP)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "minimal_app:app", "--port", str(port),
                             "--log-level", "warning", "--no-access-log"], cwd=workdir, preexec_fn=_pinned)
    wait_ready(port, "/", proc)
    return proc, port


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


# --------------------------------------------------------------------------- load generator

def _request(path: str, body: bytes, headers: str = "Content-Type: application/json\r\n") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Content-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


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
        head = await reader.readuntil(b"\r\n\r\n")
        length = -1
        status = int(head[9:12])
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        if length < 0:
            raise RuntimeError(f"response without content-length: {head!r}")
        await reader.readexactly(length)
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
                  cpus: set[int] | None = None) -> None:
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
        await asyncio.gather(*(_connection(port, reqs, stop_at, warm_until, latencies, errors, total)
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
             server_pid: int | None = None) -> dict:
    queue = mp.get_context("spawn").Queue()
    proc = mp.get_context("spawn").Process(
        target=_load_process, args=(port, requests_per_conn, duration, warmup, queue, LOAD_CPUS)
    )
    cpu_before = cpu_seconds(server_pid) if server_pid else 0.0
    proc.start()
    result = queue.get()
    proc.join()
    cpu_used = (cpu_seconds(server_pid) - cpu_before) if server_pid else 0.0
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
        # Server CPU per request (warm-up included on both sides): less sensitive than
        # req/s to other load on a shared machine.
        "cpu_us": 1e6 * cpu_used / total if total else float("nan"),
    }


# --------------------------------------------------------------------------- scenarios

def obs_row(rng, dim: int = 16) -> list[float]:
    return [round(float(x), 4) for x in rng.uniform(-1, 1, dim)]


def mlp_single(c: int, rng) -> list[list[bytes]]:
    return [[_request("/v1/models/mlp/act", json.dumps({"observation": obs_row(rng)}).encode()) for _ in range(8)]
            for _ in range(c)]


def mlp_batch64(c: int, rng) -> list[list[bytes]]:
    return [[_request("/v1/models/mlp/act", json.dumps({"observations": [obs_row(rng) for _ in range(64)]}).encode())
             for _ in range(4)] for _ in range(c)]


def infer_binary64(c: int, rng) -> list[list[bytes]]:
    """The batch64 observations as one FP32 tensor over the binary extension, outputs
    (action, logp) asked for as binary: what tritonclient sends for
    ``InferInput.set_data_from_numpy(obs)`` with ``InferRequestedOutput(name)``."""
    import numpy as np

    def one() -> bytes:
        obs = np.array([obs_row(rng) for _ in range(64)], dtype=np.float32)
        raw = obs.tobytes()
        header = json.dumps({
            "inputs": [{"name": "obs", "shape": list(obs.shape), "datatype": "FP32",
                        "parameters": {"binary_data_size": len(raw)}}],
            "outputs": [{"name": "action", "parameters": {"binary_data": True}},
                        {"name": "logp", "parameters": {"binary_data": True}}],
        }).encode()
        headers = f"Content-Type: application/octet-stream\r\nInference-Header-Content-Length: {len(header)}\r\n"
        return _request("/v2/models/mlp/infer", header + raw, headers)

    return [[one() for _ in range(4)] for _ in range(c)]


def act_binary64(c: int, rng) -> list[list[bytes]]:
    """The batch64 observations as one raw application/octet-stream act body (float32,
    C order) with X-Rlserve-Dtype/-Shape headers; answered with the JSON batch form."""
    import numpy as np

    def one() -> bytes:
        raw = np.array([obs_row(rng) for _ in range(64)], dtype=np.float32).tobytes()
        headers = "Content-Type: application/octet-stream\r\nX-Rlserve-Dtype: float32\r\nX-Rlserve-Shape: 64,16\r\n"
        return _request("/v1/models/mlp/act", raw, headers)

    return [[one() for _ in range(4)] for _ in range(c)]


def lstm_sessions(c: int, rng) -> list[list[bytes]]:
    # Each connection drives one session; the first step starts its episode (and creates
    # it), the others continue it with a reward.
    out = []
    for k in range(c):
        sid = f"bench-{k}-{rng.integers(1 << 30)}"
        first = _request("/v1/models/lstm/act", json.dumps(
            {"observation": obs_row(rng), "session_id": sid, "episode_start": True}).encode())
        steps = [_request("/v1/models/lstm/act", json.dumps(
            {"observation": obs_row(rng), "session_id": sid, "reward": 1.0}).encode()) for _ in range(8)]
        out.append([first] + steps * 50)
    return out


def lstm_stateless(c: int, rng) -> list[list[bytes]]:
    # The same LSTM model without sessions (initial state every call): what sessions cost.
    return [[_request("/v1/models/lstm/act", json.dumps({"observation": obs_row(rng)}).encode()) for _ in range(8)]
            for _ in range(c)]


def minimal(c: int, rng) -> list[list[bytes]]:
    return [[_request("/", json.dumps({"observation": obs_row(rng)}).encode())] for _ in range(c)]


# (key, label, request maker, server env; None = the minimal app instead of rlserve)
SCENARIOS = [
    ("minimal", "minimal ASGI app", minimal, None),
    ("mlp", "MLP 256x256, 1 obs", mlp_single, {}),
    ("lstm", "LSTM 256 sessions, 1 obs", lstm_sessions, {}),
    ("lstm_stateless", "LSTM 256 stateless, 1 obs", lstm_stateless, {}),
    ("batch64", "MLP 256x256, 64 obs/request", mlp_batch64, {}),
    ("binary64", "MLP 256x256, 64 obs/request, raw binary", act_binary64, {}),
    ("infer64", "MLP 256x256, 64 obs/request, OIP binary", infer_binary64, {}),
    ("nobatch", "MLP 256x256, 1 obs, batching off", mlp_single, {"RLSERVE_BATCHING": "false"}),
    ("asgi", "MLP 256x256, 1 obs, ASGI handler", mlp_single, {"RLSERVE_ACT_PROTOCOL": "false"}),
]
KEYS = [key for key, *_ in SCENARIOS]
OBS_PER_REQUEST = {"batch64": 64, "binary64": 64, "infer64": 64}


def machine_state(label: str) -> None:
    """What a reader needs to judge the numbers: when, on what, how busy, which code."""
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = "?"
    print(f"[{label}] {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  cpu: {cpu}  nproc={os.cpu_count()}  "
          f"load average (1/5/15 min): {load}  commit {commit}  python {platform.python_version()}", flush=True)


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


def write_results(path: Path, rows: list[tuple[str, int, dict, int]], args: argparse.Namespace) -> None:
    """The table's numbers as a results file (one run), for the plot and docs/benchmarks.md's table."""
    from bench_results import run_record

    labels = {key: label for key, label, *_ in SCENARIOS}
    commit = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                            text=True).stdout.strip() or "?"
    setup = (f"{'servers on CPU 0, load generator on CPU 1' if args.pin else 'not pinned'}; "
             f"server settings: {' '.join(args.env) or 'defaults'}; nproc={os.cpu_count()}")
    record = run_record("run", " ".join(["python", *sys.argv]), time.strftime("%Y-%m-%d %H:%M %Z"), commit, setup,
                        [(key, labels[key], c, res, obs) for key, c, res, obs in rows])
    path.write_text(json.dumps({"runs": [record]}, indent=1) + "\n")
    print(f"results written to {path}", flush=True)


def compare(before: list[tuple[str, int, dict, int]], after: list[tuple[str, int, dict, int]]) -> None:
    """The before/after table of this run (markdown, for docs/benchmarks.md)."""
    old = {(key, c): res for key, c, res, _ in before}
    labels = {key: label for key, label, *_ in SCENARIOS}
    print("\nbefore/after (same run, alternating):\n")
    print("| scenario | c | req/s before | req/s after | after/before | p50 ms before | p50 ms after "
          "| server CPU us/req before | after |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key, c, res, obs in after:
        if (key, c) not in old:
            continue
        b = old[(key, c)]
        unit = f" ({obs} obs each)" if obs > 1 else ""
        if b["errors"] or res["errors"]:  # e.g. a request form the baseline does not know
            print(f"| {labels[key]}{unit} | {c} | errors: {b['errors']} before, {res['errors']} after "
                  f"| | | | | | |", flush=True)
            continue
        print(f"| {labels[key]}{unit} | {c} | {b['req_s']:,.0f} | {res['req_s']:,.0f} | "
              f"{res['req_s'] / b['req_s']:.2f} | {b['p50_ms']:.2f} | {res['p50_ms']:.2f} | "
              f"{b['cpu_us']:.1f} | {res['cpu_us']:.1f} |", flush=True)


PAIRS = [  # (label, numerator, denominator, target per concurrency (None: all), concurrencies (None: all))
    ("MLP 1 obs / minimal ASGI app", "mlp", "minimal", {1: 0.5, None: 0.8}, None),
    ("LSTM sessions / LSTM stateless", "lstm", "lstm_stateless", {None: 0.8}, None),
    ("64 obs: raw binary / JSON", "binary64", "batch64", {None: 1.0}, (16,)),
    ("64 obs: OIP binary / JSON", "infer64", "batch64", {None: 1.0}, (16,)),
]
BINARY_TARGET = 250_000  # obs/s for 64-observation binary requests at c=16


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


def summarize(rows: list[tuple[str, int, dict, int]]) -> None:
    """The issue's targets, as ratios of numbers measured in this run."""
    got = {(key, c): res for key, c, res, _ in rows}

    def ratio(a: tuple[str, int], b: tuple[str, int]) -> str:
        """req/s ratio, and in brackets the inverse ratio of server CPU per request."""
        if a in got and b in got and got[b]["req_s"]:
            return f"{got[a]['req_s'] / got[b]['req_s']:.2f} [cpu {got[b]['cpu_us'] / got[a]['cpu_us']:.2f}]"
        return "n/a"

    print("\ntargets (this run):")
    for c in sorted({c for _, c in got}):
        print(f"  c={c:<3} MLP / minimal ASGI {ratio(('mlp', c), ('minimal', c))} (>= {0.5 if c == 1 else 0.8})   "
              f"LSTM sessions / MLP stateless {ratio(('lstm', c), ('mlp', c))}   "
              f"LSTM sessions / LSTM stateless {ratio(('lstm', c), ('lstm_stateless', c))} (>= 0.8)")
    for c in sorted({c for _, c in got}):
        json64, raw64, infer64 = got.get(("batch64", c)), got.get(("binary64", c)), got.get(("infer64", c))
        if json64 is not None or raw64 is not None or infer64 is not None:
            def obs_s(res: dict | None) -> str:
                return "n/a" if res is None else f"{res['req_s'] * 64:>9.0f}"
            print(f"  64-obs requests c={c:<3} JSON {obs_s(json64)} obs/s   raw binary {obs_s(raw64)} obs/s   "
                  f"OIP binary {obs_s(infer64)} obs/s (binary >= {BINARY_TARGET})")
    worst = max(((res["p99_ms"] / res["p50_ms"], key, c) for (key, c), res in got.items()
                 if key != "minimal" and res["p50_ms"] > 0), default=None)
    if worst:
        print(f"  worst p99/p50: {worst[0]:.2f} ({worst[1]} c={worst[2]}) (<= 3)")


if __name__ == "__main__":
    main()
