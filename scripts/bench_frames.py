"""The host side of image batches: CPU spent on a batch's frames before the model runs.

Not a test: it prints numbers and the machine. A GPU server answering a VisionNet policy
spends its CPU moving frames (an 84x84x4 uint8 frame is 28 KB, 113 KB as float32), not
running the network. This measures that path of the served policy's own code on any
machine, the model left out: ``--requests`` raw act bodies of ``--rows`` uint8 frames each
become rows (``raw_rows``), each is prepared (``Preparer.prepare``), and the batch's ``obs``
input is built as the model gets it, in two ways:

- ``batch cast``: the batch step hands the runtime float32 (ONNX Runtime and TorchScript on
  the CPU);
- ``staging cast``: the batch goes to a runtime that copies its inputs into a reused host
  block, casting there (the CUDA runtimes' pinned staging; pageable memory here).

    python scripts/bench_frames.py [--rows 64] [--requests 8] [--seconds 3] [--code CHECKOUT]

``--code CHECKOUT`` measures another checkout's code (bench_server.py's ``--baseline``
path), so a change and its parent can be compared on the same machine; a checkout from
before integer frames stayed narrow casts every request to float32 on its own.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_gpu  # noqa: E402  (the VisionNet bundle)
import bench_server  # noqa: E402  (baseline_root, machine_state)


class _Staged:
    """The served runtime's description, as a runtime that casts on its staging copy."""

    casts_inputs = True

    def __init__(self, runtime):
        self.kind, self.device, self.input_dtypes = runtime.kind, runtime.device, runtime.input_dtypes


def measure(repo: Path, rows: int, requests: int, seconds: float) -> dict[str, float]:
    import numpy as np

    from rlserve.service.act.binary import raw_rows
    from rlserve.service.engine.runtime.staging import HostStaging
    from rlserve.service.serving.loading import load_policy
    from rlserve.service.settings import Settings
    from rlserve.service.step.batch import BatchStep
    from rlserve.service.step.sizes import Expect

    policy = load_policy(repo / "vision", Settings(repository=repo))
    expect = Expect(65536, (tuple(policy.pipeline.obs_space.shape),))
    headers = [(b"content-type", b"application/octet-stream"), (b"x-rlserve-dtype", b"uint8"),
               (b"x-rlserve-shape", ",".join(map(str, (rows, *bench_gpu.IMAGE))).encode())]
    bodies = [bench_gpu.observations("vision", rows, seed).tobytes() for seed in range(requests)]
    staged_step = BatchStep(policy.step.signature, _Staged(policy.runtime), policy.pipeline, policy.sessions,
                            policy.step.mask_layout)
    staging = HostStaging()
    f32 = np.dtype(np.float32)

    def one_batch(step: BatchStep, stage: bool) -> float:
        started = time.process_time()
        steps = [policy.preparer.prepare(raw_rows(headers, body, expect)[0], explore=False, extras=frozenset())
                 for body in bodies]
        obs = step._batch_obs(steps)
        if stage:
            obs = staging.stage("obs", obs, f32)
        assert obs.dtype == f32 and len(obs) == rows * requests
        return time.process_time() - started

    results = {}
    for label, step, stage in (("batch cast", policy.step, False), ("staging cast", staged_step, True)):
        times: list[float] = []
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline or len(times) < 5:
            times.append(one_batch(step, stage))
        results[label] = 1e6 * statistics.median(times) / requests
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64, help="frames per request")
    parser.add_argument("--requests", type=int, default=8, help="requests per batch")
    parser.add_argument("--seconds", type=float, default=3.0, help="per way of casting")
    parser.add_argument("--code", type=Path, default=None, metavar="CHECKOUT")
    parser.add_argument("--bundles", type=Path, default=None,
                        help="keep the exported VisionNet bundle in this folder and reuse it (as bench_gpu.py's)")
    parser.add_argument("--repo", type=Path, default=None, help=argparse.SUPPRESS)  # the re-run's bundles
    args = parser.parse_args()
    if args.repo is not None:  # the measurement itself, in whichever code is on the path
        for label, us in measure(args.repo, args.rows, args.requests, args.seconds).items():
            print(f"{label:>12}: {us:8.0f} us of CPU per {args.rows}-frame request "
                  f"({1e3 * us / args.rows:6.0f} ns per frame)", flush=True)
        return
    bench_server.machine_state("start")
    with tempfile.TemporaryDirectory(prefix="rlserve-bench-frames-") as tmp:
        repo = args.bundles or Path(tmp) / "repo"
        repo.mkdir(parents=True, exist_ok=True)
        bench_gpu.build_bundles(repo, ["vision"])
        path = str(bench_server.ROOT)
        if args.code is not None:
            path = f"{bench_server.baseline_root(args.code, Path(tmp))}{os.pathsep}{path}"
        print(f"code: {args.code or bench_server.ROOT}; {args.requests} requests of {args.rows} uint8 84x84x4 "
              f"frames per batch", flush=True)
        command = [sys.executable, __file__, "--repo", str(repo), "--rows", str(args.rows),
                   "--requests", str(args.requests), "--seconds", str(args.seconds)]
        subprocess.run(command, env={**os.environ, "PYTHONPATH": path}, check=True)


if __name__ == "__main__":
    main()
