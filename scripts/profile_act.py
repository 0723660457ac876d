"""Where the microseconds of one single-observation act request go, in process (not a test).

Loads the benchmark MLP bundle (``bench_server.build_bundles``: 16 floats -> 256x256 tanh,
Discrete(4), ONNX) into a ``Policy`` and times each stage of the single-row path on its
own, median of many calls with warm caches (thread CPU time is not used: these are short
and single-threaded, so wall time is the CPU time when the machine is not oversubscribed):

    decode (msgspec) -> rows -> prepare -> [batch of 1] obs array -> ONNX Runtime ->
    distribution (build, sample, logp) -> split/encode -> response JSON

    python scripts/profile_act.py [--repo DIR] [--iterations 5000]

Over HTTP each stage costs about twice as much (the HTTP stack and the load generator pass
through the caches between stages; see docs/benchmarks.md), and uvicorn's parsing, the
event loop and the socket write come on top.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

BODY = (b'{"observation": [0.1, -0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, '
        b'0.8]}')


def median_us(fn: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1000


def profile(repo: Path, n: int) -> list[tuple[str, float]]:
    import numpy as np

    from rlserve.service.act.use_case import Accepted, ActService
    from rlserve.service.act.wire import decode_request, to_rows
    from rlserve.service.engine.batcher import BatchInfo, Job
    from rlserve.service.serving.loading import load_policy
    from rlserve.service.serving.registry import ModelRegistry
    from rlserve.service.settings import Settings

    policy = load_policy(repo / "mlp", Settings())
    registry = ModelRegistry(Settings(), None)
    prep, batch = policy.preparer, policy.step
    req = decode_request(BODY)
    rows = to_rows(req, Settings().max_rows)
    step = prep.prepare(rows, explore=None, extras=frozenset())
    obs = batch._batch_obs([step])
    dist_inputs = batch.runtime.run({"obs": obs})["dist_inputs"]
    spec = policy.pipeline.dist_spec
    dist = spec.build(dist_inputs)
    rng = np.random.default_rng(0)
    actions, logp, entropy = batch._act([step], dist_inputs)
    outputs = batch.run([step])
    accepted = Accepted(0.0, "mlp", policy, True, False, False, False, step, [None], Job(step, 1))
    info = BatchInfo(1, 1, 1, 0.0)
    stages: list[tuple[str, Callable[[], object]]] = [
        ("decode the JSON body (msgspec)", lambda: decode_request(BODY)),
        ("single/batch form -> Rows", lambda: to_rows(req, Settings().max_rows)),
        ("prepare: validate the row -> Step", lambda: prep.prepare(rows, explore=None, extras=frozenset())),
        ("batch: the obs array (B=1)", lambda: batch._batch_obs([step])),
        ("ONNX Runtime, full graph (with value)", lambda: batch.runtime.run({"obs": obs})),
    ]
    if hasattr(batch.runtime, "run_policy"):
        stages.append(("ONNX Runtime, policy graph (no value)", lambda: batch.runtime.run_policy({"obs": obs})))
    stages += [
        ("distribution: build (log-softmax, softmax)", lambda: spec.build(dist_inputs)),
        ("distribution: sample", lambda: dist.sample(rng)),
        ("distribution: logp of the sample", (lambda: dist.logp_of_sample()) if hasattr(dist, "logp_of_sample")
         else (lambda: dist.logp(actions))),
        ("batch: distribution step as served (_act)", lambda: batch._act([step], dist_inputs)),
        ("batch: encode once, split per request", lambda: batch._split([step], actions, logp, entropy, None,
                                                                       dist_inputs)),
        ("batch: the whole BatchStep.run", lambda: batch.run([step])),
        ("response: ActResponse + JSON bytes", lambda: ActService(registry)._finish(accepted, outputs[0], info)),
    ]
    return [(name, median_us(fn, n)) for name, fn in stages]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, default=None, help="a repository with the bench 'mlp' bundle")
    parser.add_argument("--iterations", type=int, default=5000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = args.repo
        if repo is None:
            import bench_server

            repo = Path(tmp) / "repo"
            bench_server.build_bundles(repo)
        results = profile(repo, args.iterations)
    print("| stage (single observation, in process, warm caches) | µs (median) |")
    print("|---|---|")
    for name, us in results:
        print(f"| {name} | {us:.1f} |")


if __name__ == "__main__":
    main()
