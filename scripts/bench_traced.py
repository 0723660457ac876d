"""A module traced with ``--trust-code`` against the same module exported from data, same server, same run.

Not a test: it prints numbers and the machine. A default new-stack PPO module (RLlib's
256x256 MLP with its value tower; the checkpoint given, by default the shared oracle's
CartPole one) is exported twice: from data, as rlserve rebuilds RLlib's default modules
(``rlserve export``), and by tracing the module RLlib restores, as ``--trust-code`` does for
a custom class (run in an environment with RLlib: ``--ray-python``, default the one the tests
make, ``tests/ray_venv.py``). One ``rlserve serve`` serves both (``data`` and ``traced``);
bench_server.py's closed-loop load generator (pinned as it pins) sends one observation per
request at each concurrency, the two models alternating within every round, and prints
requests per second, p50/p99 and server CPU per request, then traced/data per round. First,
the two acting graphs alone in ONNX Runtime (batch 1 and 64, least time of repeated blocks):
the comparison that other load on a shared machine disturbs least.

    python scripts/bench_traced.py [--checkpoint DIR] [--ray-python PATH] [--duration 3] [--rounds 3]
        [--concurrency 1 16 64]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_server as bench  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CHECKPOINT = ROOT.parent / "shared" / "oracle" / "newstack" / "ppo_cartpole_mlp" / "checkpoint"


def _trace(checkpoint: Path, out: Path) -> None:
    """(In the RLlib environment.) The default module exported the --trust-code way."""
    from rlserve.models.newstack import read_module_checkpoint
    from rlserve.models.newstack.modules import CUSTOM_KIND
    from rlserve.models.traced.export import export_traced_module

    module = dataclasses.replace(read_module_checkpoint(checkpoint), kind=CUSTOM_KIND)
    export_traced_module(module, out, name="traced")


def _exports(checkpoint: Path, repo: Path, ray_python: str) -> None:
    done = subprocess.run([sys.executable, "-m", "rlserve.service.cli", "export", str(checkpoint), "--out",
                           str(repo / "data"), "--quiet"], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"exporting from data failed: {done.stderr}")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([ray_python, __file__, "--trace-into", str(repo / "traced"), "--checkpoint",
                           str(checkpoint)], capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"tracing failed: {done.stderr[-3000:]}")


def _single(model: str):
    def make(c: int, rng) -> list[list[bytes]]:
        return [[bench._request(f"/v1/models/{model}/act", json.dumps({"observation": bench.obs_row(rng, 4),
                                                                        "explore": True}).encode())
                 for _ in range(64)] for _ in range(c)]
    return make


def _runtime_only(repo: Path, rounds: int) -> None:
    """The two acting graphs in ONNX Runtime alone (one thread), interleaved: the least time of
    each over repeated blocks of calls, which other load on the machine can only lengthen."""
    import timeit

    import numpy as np

    from rlserve.models.export.bundle import load_bundle
    from rlserve.models.export.onnx import onnx_runner

    runners = {m: onnx_runner(load_bundle(repo / m).policy_path("onnx") or load_bundle(repo / m).runtime_path("onnx"))
               for m in ("data", "traced")}
    for batch in (1, 64):
        feed = {"obs": np.random.default_rng(batch).uniform(-1, 1, (batch, 4)).astype(np.float32)}
        best = {m: float("inf") for m in runners}
        for _ in range(rounds * 3):  # blocks alternate, so neither graph always runs first
            for m, run in runners.items():
                best[m] = min(best[m], timeit.timeit(lambda run=run, feed=feed: run(feed), number=500) / 500)
        print(f"ONNX Runtime acting graph, batch {batch:>2}: data {1e6 * best['data']:7.1f} us  traced "
              f"{1e6 * best['traced']:7.1f} us  traced/data time {best['traced'] / best['data']:.3f}")


def _default_ray_python() -> str:
    sys.path.insert(0, str(ROOT / "tests"))
    from ray_venv import ray_python

    return str(ray_python())


def main() -> None:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    parser.add_argument("--ray-python", default=None, help="an interpreter with ray, torch and rlserve")
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--trace-into", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trace_into is not None:
        _trace(args.checkpoint, args.trace_into)
        return
    if (os.cpu_count() or 1) >= 2:
        bench.SERVER_CPUS, bench.LOAD_CPUS = {0}, {1}
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.2f}; server pinned to {bench.SERVER_CPUS}, load to {bench.LOAD_CPUS}")
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="bench-traced-") as tmp:
        repo = Path(tmp) / "repo"
        _exports(args.checkpoint, repo, args.ray_python or _default_ray_python())
        _runtime_only(repo, args.rounds)
        proc, port = bench.start_rlserve(repo, {})
        ratios: dict[int, list[float]] = {c: [] for c in args.concurrency}
        try:
            for r in range(args.rounds):
                for c in args.concurrency:
                    order = ("data", "traced") if r % 2 == 0 else ("traced", "data")
                    got = {}
                    for model in order:
                        got[model] = bench.run_load(port, _single(model)(c, rng), args.duration, args.warmup, proc.pid)
                        bench.show(f"round {r + 1} {model}", c, got[model], 1)
                    ratios[c].append(got["traced"]["req_s"] / got["data"]["req_s"])
        finally:
            bench.stop(proc)
    for c, values in ratios.items():
        print(f"traced/data req/s at c={c}: median {statistics.median(values):.3f} "
              f"(rounds: {', '.join(f'{v:.3f}' for v in values)})")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
