"""How fast rlserve's request path is with the model taken out (not a test: it prints numbers).

Issue 13 asks single-observation MLP requests to reach 0.5x (c=1) and 0.8x (c=16, 64) the
requests per second of a minimal ASGI app that parses nothing and returns a fixed body.
This script measures what bounds that ratio: it copies this checkout's ``models/`` and
``service/`` into a temporary directory, changes one function of the copy so that a batch
computes nothing (``BatchStep._run`` answers action 0, a fixed logp and zero logits with no
ONNX Runtime call and no distribution step), and serves the same MLP bundle from three
servers pinned to CPU 0, with the load generator of ``bench_server.py`` on CPU 1:

- the minimal ASGI app (``bench_server.MINIMAL_APP``, the same uvicorn);
- "floor": ``rlserve serve`` from the copy: HTTP, JSON decoding, validation, batching,
  the answer's JSON, metrics, everything but the model;
- "rlserve": ``rlserve serve`` from this checkout.

Rounds rotate the order (A B C, then C B A, ...); each round's ratio to the minimal app is
printed, with the medians and each server's CPU time per request. Whatever "floor" reaches
against the minimal app is the most any change to the model or distribution could give.

    python scripts/bench_floor.py [--rounds 7] [--concurrency 1 16 64] [--duration 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_server as bench  # noqa: E402  (the sibling script, by path)

ROOT = Path(__file__).resolve().parents[1]

# The runtime call and the distribution step of ``BatchStep._run``, and what the copy does instead.
_MODEL_WORK = """        wants_value = any("value" in s.extras for s in steps)
        outputs = self.runtime.run(inputs, value=wants_value)
        dist_inputs = outputs["dist_inputs"]
        dist_inputs = self._apply_masks(steps, dist_inputs)
        actions, logp, entropy = self._act(steps, dist_inputs)
"""
_NO_MODEL_WORK = """        wants_value, outputs = False, {}  # bench_floor.py: no runtime call, no distribution
        rows = len(inputs["obs"])
        dist_inputs = np.zeros((rows, self.pipeline.dist_spec.num_outputs), np.float32)
        actions, logp, entropy = np.zeros(rows, np.int64), np.full(rows, -1.3862944, np.float32), None
"""


def floor_checkout(workdir: Path) -> Path:
    """A copy of this checkout's code whose batches compute nothing."""
    copy = workdir / "floor"
    for name in ("models", "service"):
        shutil.copytree(ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
    batch = copy / "service" / "step" / "batch.py"
    text = batch.read_text()
    if text.count(_MODEL_WORK) != 1:
        raise SystemExit(f"{batch.relative_to(copy)}: BatchStep._run changed; update _MODEL_WORK in {__file__}")
    batch.write_text(text.replace(_MODEL_WORK, _NO_MODEL_WORK))
    return copy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=(os.cpu_count() or 1) >= 2,
                        help="servers on CPU 0, the load generator on CPU 1 (default with >= 2 CPUs)")
    args = parser.parse_args()
    if args.pin:
        bench.SERVER_CPUS, bench.LOAD_CPUS = {0}, {1}
    bench.machine_state("start")
    print(f"pinned: {'servers on CPU 0, load generator on CPU 1' if args.pin else 'no'}; "
          f"{args.duration:g} s per point after {args.warmup:g} s warm-up", flush=True)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        repo = work / "repo"
        bench.build_bundles(repo)
        floor_root = bench.baseline_root(floor_checkout(work), work)
        servers = {"minimal": bench.start_minimal(work), "floor": bench.start_rlserve(repo, {}, floor_root),
                   "rlserve": bench.start_rlserve(repo, {})}
        summary = []
        try:
            for c in args.concurrency:
                got: dict[str, list[dict]] = {name: [] for name in servers}
                for i in range(args.rounds):
                    order = list(servers) if i % 2 == 0 else list(reversed(servers))
                    for name in order:
                        proc, port = servers[name]
                        make = bench.minimal if name == "minimal" else bench.mlp_single
                        got[name].append(bench.run_load(port, make(c, rng), args.duration, args.warmup, proc.pid))
                    print(f"c={c:<3} round {i}: " + "   ".join(
                        f"{name} {got[name][-1]['req_s']:,.0f} req/s {got[name][-1]['cpu_us']:.1f} us/req "
                        f"{got[name][-1]['errors']} errors"
                        for name in servers), flush=True)
                for name in ("floor", "rlserve"):
                    ratios = [a["req_s"] / m["req_s"] for a, m in zip(got[name], got["minimal"], strict=True)]
                    cpu = statistics.median(r["cpu_us"] for r in got[name])
                    summary.append(f"| {c} | {name} / minimal | {statistics.median(ratios):.2f} | "
                                   f"{min(ratios):.2f}-{max(ratios):.2f} | {' '.join(f'{r:.2f}' for r in ratios)} "
                                   f"| {cpu:.1f} | {statistics.median(r['cpu_us'] for r in got['minimal']):.1f} |")
        finally:
            for proc, _ in servers.values():
                bench.stop(proc)
    print("\n| c | ratio | median of per-round ratios | range | each round | server CPU us/req | minimal's |")
    print("|---|---|---|---|---|---|---|")
    for line in summary:
        print(line)
    bench.machine_state("end")


if __name__ == "__main__":
    main()
