"""The GPU benchmark: the same server on the CPU runtime and on CUDA, in one run (prints
numbers; not a test).

    python scripts/bench_gpu.py                      # CPU, and CUDA where this machine has it
    python scripts/bench_gpu.py --devices cpu --duration 1 --workers 2

For each device (``RLSERVE_DEVICE``) and worker count (1 and ``--workers``) one
``rlserve serve`` serves two bundles exported on the fly: an MLP (16 floats -> 256 -> 256 ->
Discrete(4)) and RLlib's VisionNet on 84x84x4 uint8 frames (Discrete(6)). Each cell sends
binary requests of 64 and 1,024 rows: the Open Inference Protocol's binary tensor data
(``--paths oip``, outputs ``action`` and ``logp`` as binary) and/or a raw
``application/octet-stream`` act body (``raw``, answered with JSON). The table gives
requests/s, observations/s, p50/p99 latency and errors per cell, then the GPU/CPU ratio per
cell and the issue's targets, and ``--json`` keeps everything with the machine's
description (CPU model, cores, GPU, driver, onnxruntime and its providers).

``--device-cast off`` starts every server with ``RLSERVE_ONNX_DEVICE_CAST=false``, so that the
VisionNet's uint8 frames are cast to float32 on the host instead of on the GPU: two runs, one
with each, on the same warm machine, split what the device cast gives from the rest. Every
cell records what its model's runtime reported (``inputs_cast_on_device``; absent on the CPU).

The load generator is scripts/bench_server.py's (closed loop: keep-alive connections, one
request in flight each, requests pre-built once and shared), in ``--clients`` processes so
that it outruns the server. Every cell is ``--warmup`` + ``--duration`` seconds; the run
stops starting cells after ``--budget`` seconds and says which it skipped. With the
defaults on a 16-core machine it takes about three and a half minutes.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_server as load  # noqa: E402  (the load generator and machine_state)

IMAGE = (84, 84, 4)
MODELS = {"mlp": "MLP 16-256-256-4", "vision": "VisionNet 84x84x4 uint8"}
# The kernel spreads connections over the workers unevenly when they open; a worker that
# got many 1,024-row connections would answer 503 under the default queue limit (4,096
# rows on the CPU) and the run would measure refusals. Both devices get this one.
QUEUE_LIMIT = 65536


# --------------------------------------------------------------------------- bundles

def build_bundles(repo: Path, names: Sequence[str] = ("mlp", "vision")) -> None:
    """Export the bundles ``names`` into ``repo``, each one that is not there yet (a
    ``--bundles`` folder keeps them between runs)."""
    import gymnasium.spaces as gs
    import numpy as np
    import torch

    from rlserve.models.catalog import build_model
    from rlserve.models.export.exporter import export_bundle

    torch.set_num_threads(min(8, os.cpu_count() or 1))
    specs = {
        "mlp": (gs.Box(-1.0, 1.0, (16,), np.float32), gs.Discrete(4), {"fcnet_hiddens": [256, 256]}),
        "vision": (gs.Box(0, 255, IMAGE, np.uint8), gs.Discrete(6), {}),  # RLlib's 84x84 conv filters
    }
    for name in names:
        if (repo / name / "manifest.json").is_file():
            continue
        obs, act, config = specs[name]
        torch.manual_seed(0)
        model = build_model(obs, act, config)
        export_bundle(model, obs_space=obs, action_space=act, model_config=config, out_dir=repo / name,
                      name=name, version="1", formats=["onnx"])


# --------------------------------------------------------------------------- requests

def observations(model: str, rows: int, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    if model == "mlp":
        return rng.uniform(-1, 1, (rows, 16)).astype(np.float32)
    return rng.integers(0, 256, (rows, *IMAGE), dtype=np.uint8)


def oip_request(model: str, obs) -> bytes:
    raw = obs.tobytes()
    header = json.dumps({
        "inputs": [{"name": "obs", "shape": list(obs.shape), "datatype": "FP32" if obs.dtype.kind == "f" else "UINT8",
                    "parameters": {"binary_data_size": len(raw)}}],
        "outputs": [{"name": "action", "parameters": {"binary_data": True}},
                    {"name": "logp", "parameters": {"binary_data": True}}],
    }).encode()
    headers = f"Content-Type: application/octet-stream\r\nInference-Header-Content-Length: {len(header)}\r\n"
    return load._request(f"/v2/models/{model}/infer", header + raw, headers)


def raw_request(model: str, obs) -> bytes:
    headers = (f"Content-Type: application/octet-stream\r\nX-Rlserve-Dtype: {obs.dtype.name}\r\n"
               f"X-Rlserve-Shape: {','.join(map(str, obs.shape))}\r\n")
    return load._request(f"/v1/models/{model}/act", obs.tobytes(), headers)


BUILDERS = {"oip": oip_request, "raw": raw_request}


# --------------------------------------------------------------------------- servers

def start_server(repo: Path, device: str, workers: int, timeout: float,
                 device_cast: bool = True) -> tuple[subprocess.Popen, int]:
    port = load.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSERVE_")}
    env.update(RLSERVE_DEVICE=device, RLSERVE_LOG_LEVEL="warning", RLSERVE_REPOSITORY=str(repo),
               RLSERVE_PORT=str(port), RLSERVE_WORKERS=str(workers), RLSERVE_QUEUE_LIMIT=str(QUEUE_LIMIT),
               RLSERVE_ONNX_DEVICE_CAST=str(device_cast).lower())
    # Its own process group: stopping it reaches every worker.
    proc = subprocess.Popen([sys.executable, "-m", "rlserve.service.cli", "serve"], env=env,
                            start_new_session=True)
    try:
        load.wait_ready(port, "/readyz", proc, timeout=timeout)
    except BaseException:
        stop_server(proc)
        raise
    return proc, port


def stop_server(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def runtime_of(port: int, model: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models/{model}", timeout=10) as response:
        return json.loads(response.read())["runtime"]


def prime(port: int, request: bytes) -> None:
    """Requests one after another for a moment: the first batches of a shape pay one-off
    costs (cuDNN's algorithm choice, the device allocator's growth) outside the measurement."""
    load._load_process(port, [[request]], 0.3, 0.0, _Sink())


class _Sink:
    def put(self, item) -> None:
        if isinstance(item, BaseException):
            raise item


# --------------------------------------------------------------------------- load

def run_cell(port: int, requests: list[bytes], connections: int, clients: int, duration: float,
             warmup: float) -> dict:
    """``connections`` keep-alive connections cycling through ``requests`` (shared bytes),
    spread over ``clients`` load processes; their results merged."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    per = [connections // clients + (1 if i < connections % clients else 0) for i in range(clients)]
    procs = [ctx.Process(target=load._load_process, args=(port, [requests] * n, duration, warmup, queue))
             for n in per if n]
    for proc in procs:
        proc.start()
    results = [queue.get() for _ in procs]
    for proc in procs:
        proc.join()
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        raise RuntimeError(f"load generator failed: {failed[0]!r}")
    latencies = sorted(x for lat, _, _ in results for x in lat)
    n, errors = len(latencies), sum(len(err) for _, err, _ in results)
    # Only answered requests count: a refusal (503 when a queue is full) is fast and would
    # inflate the rate.
    return {"requests": n, "req_s": (n - errors) / duration, "errors": errors,
            "p50_ms": 1e3 * latencies[n // 2] if n else math.nan,
            "p99_ms": 1e3 * latencies[min(n - 1, int(n * 0.99))] if n else math.nan}


# --------------------------------------------------------------------------- machine

def cuda_missing() -> str | None:
    """Why this machine cannot serve on CUDA (None when it can)."""
    import onnxruntime as ort

    from rlserve.service.engine.runtime.device import CUDA_EP, cuda_device_count

    if CUDA_EP not in ort.get_available_providers():
        return f"onnxruntime {ort.__version__} has no {CUDA_EP}"
    count, why = cuda_device_count()
    return None if count else why


def machine() -> dict:
    import onnxruntime as ort

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "?")
    gpu = "none"
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip() or "none"
    except (OSError, subprocess.SubprocessError):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "gpu": gpu, "python": platform.python_version(),
            "onnxruntime": ort.__version__, "providers": ort.get_available_providers(),
            "time": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


# --------------------------------------------------------------------------- report

def show(cell: dict) -> None:
    if "error" in cell:
        print(f"{cell['device']:<5} {cell['model']:<6} w={cell['workers']:<2} rows={cell['rows']:<5} "
              f"{cell['path']:<4} {cell['error']}", flush=True)
        return
    print(f"{cell['device']:<5} {cell['model']:<6} w={cell['workers']:<2} rows={cell['rows']:<5} {cell['path']:<4} "
          f"c={cell['connections']:<4} {cell['req_s']:>9,.0f} req/s {cell['obs_s']:>12,.0f} obs/s  "
          f"p50 {cell['p50_ms']:7.2f} ms  p99 {cell['p99_ms']:7.2f} ms  errors {cell['errors']}", flush=True)


def summary(cells: list[dict], workers: int) -> dict:
    """The markdown table of GPU/CPU ratios and the issue's two targets."""
    got = {(c["device"], c["model"], c["workers"], c["rows"], c["path"]): c for c in cells if "error" not in c}
    print("\n| model | workers | rows/request | path | CPU obs/s | CUDA obs/s | CUDA / CPU | CUDA p50 ms |")
    print("|---|---|---|---|---|---|---|---|")
    ratios: dict[str, float] = {}
    for (device, model, w, rows, path), gpu in sorted(got.items()):
        if device != "cuda":
            continue
        cpu = got.get(("cpu", model, w, rows, path))
        ratio = gpu["obs_s"] / cpu["obs_s"] if cpu and cpu["obs_s"] else math.nan
        ratios[f"{model}/w{w}/{rows}/{path}"] = ratio
        print(f"| {MODELS[model]} | {w} | {rows} | {path} | {cpu['obs_s'] if cpu else math.nan:,.0f} | "
              f"{gpu['obs_s']:,.0f} | {ratio:.1f}x | {gpu['p50_ms']:.2f} |")
    mlp_best = max((c["obs_s"] for k, c in got.items() if k[0] == "cuda" and k[1] == "mlp" and k[2] == workers),
                   default=math.nan)
    # The VisionNet's ratio for each worker count run (CUDA and the CPU with the same count).
    vision_by_workers = {w: max((r for k, r in ratios.items() if k.startswith(f"vision/w{w}/")), default=math.nan)
                         for w in sorted({k[2] for k in got}, reverse=True)}
    vision_best = vision_by_workers.get(workers, math.nan)
    by_workers = "; ".join(f"{w} worker{'s' if w > 1 else ''}: {r:.1f}x (>= 10: {'yes' if r >= 10 else 'no'})"
                           for w, r in vision_by_workers.items())
    print(f"\ntargets: MLP on CUDA with {workers} workers, best cell: {mlp_best:,.0f} obs/s (>= 1,000,000: "
          f"{'yes' if mlp_best >= 1e6 else 'no'}); VisionNet CUDA / CPU, best cell with {by_workers or 'none'}",
          flush=True)
    return {"ratios": ratios, "mlp_cuda_best_obs_s": mlp_best, "vision_cuda_over_cpu_best": vision_best,
            "vision_cuda_over_cpu_best_by_workers": vision_by_workers}


# --------------------------------------------------------------------------- main

def parse() -> argparse.Namespace:
    cores = os.cpu_count() or 2
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", nargs="+", choices=["cpu", "cuda"], default=["cpu", "cuda"],
                        help="cuda is left out, saying why, where this machine cannot serve on it")
    parser.add_argument("--workers", type=int, default=max(2, cores // 2),
                        help="server processes of the second column (the first is 1); default half the cores")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--rows", nargs="+", type=int, default=[64, 1024])
    parser.add_argument("--paths", nargs="+", choices=list(BUILDERS), default=["oip"])
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per cell")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each cell")
    parser.add_argument("--clients", type=int, default=max(1, min(4, cores // 4)), help="load generator processes")
    parser.add_argument("--budget", type=float, default=230.0, help="start no cell after this many seconds")
    parser.add_argument("--start-timeout", type=float, default=60.0, help="seconds a server may take to be ready")
    parser.add_argument("--device-cast", choices=["on", "off"], default="on",
                        help="RLSERVE_ONNX_DEVICE_CAST of every server (off: integer inputs cast on the host)")
    parser.add_argument("--json", type=Path, default=None, help="write the run here as JSON")
    parser.add_argument("--bundles", type=Path, default=None,
                        help="keep the exported bundles in this folder and reuse those there (default: a new export)")
    return parser.parse_args()


def connections_for(rows: int, workers: int) -> int:
    """Enough requests in flight to keep every worker busy (connections are spread over
    the workers by the kernel, unevenly, when they are opened)."""
    return max(32, 16 * workers) if rows <= 64 else max(8, 4 * workers)


def main() -> int:
    args = parse()
    # A timeout's SIGTERM unwinds through the finally blocks that stop the servers (each
    # in its own process group, out of the timeout's reach).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = time.monotonic()
    load.machine_state("start")
    description = machine()
    print(f"machine: {description}", flush=True)
    devices = list(args.devices)
    skipped: dict[str, str] = {}
    if "cuda" in devices and (why := cuda_missing()) is not None:
        devices.remove("cuda")
        skipped["cuda"] = why
        print(f"cuda: left out ({why})", flush=True)
    cells: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = args.bundles or Path(tmp) / "repo"
        t0 = time.monotonic()
        build_bundles(repo, args.models)
        print(f"bundles exported in {time.monotonic() - t0:.1f} s", flush=True)
        requests = {(m, r, p): [BUILDERS[p](m, observations(m, r, seed)) for seed in range(2)]
                    for m in args.models for r in args.rows for p in args.paths}
        # The targets are measured with --workers: those servers go first, CUDA then
        # the CPU, so that a run cut short by --budget loses the single-worker cells.
        for workers in sorted({1, args.workers}, reverse=True):
            for device in sorted(devices, reverse=True):
                cells += serve_and_measure(args, repo, requests, device, workers, started)
    result = {"machine": description, "args": {k: str(v) for k, v in vars(args).items()}, "left_out": skipped,
              "cells": cells, "summary": summary(cells, args.workers)}
    load.machine_state("end")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1, default=str))
        print(f"wrote {args.json}")
    return 0 if cells and all("error" not in c and c["errors"] == 0 for c in cells) else 1


def serve_and_measure(args: argparse.Namespace, repo: Path, requests: dict, device: str, workers: int,
                      started: float) -> list[dict]:
    base = [dict(device=device, model=m, workers=workers, rows=r, path=p) for (m, r, p) in requests]
    if time.monotonic() - started > args.budget:
        return [dict(cell, error="skipped: out of time (--budget)") for cell in base]
    t0 = time.monotonic()
    try:
        proc, port = start_server(repo, device, workers, args.start_timeout, args.device_cast == "on")
    except (RuntimeError, OSError) as exc:
        return [dict(cell, error=f"server did not start: {exc}") for cell in base]
    cells: list[dict] = []
    try:
        try:
            runtimes = {m: runtime_of(port, m) for m in args.models}
        except OSError as exc:
            return [dict(cell, error=f"no model metadata: {exc!r}") for cell in base]
        print(f"\n{device}, {workers} worker(s): ready in {time.monotonic() - t0:.1f} s; runtimes "
              f"{ {m: (r['device'], r.get('providers')) for m, r in runtimes.items()} }; inputs cast on the "
              f"device: { {m: r.get('inputs_cast_on_device') for m, r in runtimes.items()} }", flush=True)
        for cell in base:
            if time.monotonic() - started > args.budget:
                cells.append(dict(cell, error="skipped: out of time (--budget)"))
                show(cells[-1])
                continue
            key = (cell["model"], cell["rows"], cell["path"])
            connections = connections_for(cell["rows"], workers)
            try:
                prime(port, requests[key][0])
                res = run_cell(port, requests[key], connections, min(args.clients, connections), args.duration,
                               args.warmup)
            except Exception as exc:  # one cell's failure (a dead server, a refused request) is its own
                cells.append(dict(cell, error=f"failed: {exc!r}"))
            else:
                runtime = runtimes[cell["model"]]
                cells.append(dict(cell, connections=connections, server_device=runtime["device"],
                                  inputs_cast_on_device=runtime.get("inputs_cast_on_device"),
                                  obs_s=res["req_s"] * cell["rows"], **res))
            show(cells[-1])
    finally:
        stop_server(proc)
    return cells


if __name__ == "__main__":
    sys.exit(main())
