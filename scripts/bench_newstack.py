"""Benchmark: a new-API-stack MLP policy against the same-sized old-stack bundle, same server, same run.

Not a test: it prints numbers. It exports a new-stack checkpoint (default: the shared
oracle's ``ppo_cartpole_mlp``, RLlib's default 256x256 tanh MLP with separate actor and
critic encoders) with ``rlserve.models.export.from_checkpoint``, builds an old-stack
bundle of the same size with the ModelV2 catalog (same spaces, ``fcnet_hiddens``,
``vf_share_layers=False``: a separate value tower, as PPO's critic encoder), serves both
from one ``rlserve serve`` process, and drives each with ``bench_server.py``'s closed-loop
load generator, alternating the two models point by point (A B, then B A) so that load
bursts on a shared machine hit both alike:

    python scripts/bench_newstack.py [--checkpoint DIR] [--duration 5] [--concurrency 1 16 64] [--rounds 3]

Prints req/s, p50, p99 and server CPU per request for each model and concurrency, each
round's new/old ratio of req/s, and the median ratio per concurrency.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import bench_server as bench

ROOT = Path(__file__).resolve().parents[1]


def _default_checkpoint() -> Path:
    folder = os.environ.get("RLSERVE_NEWSTACK_DIR") or str(ROOT.parent / "shared" / "oracle" / "newstack")
    return Path(folder) / "ppo_cartpole_mlp" / "checkpoint"


def build_bundles(repo: Path, checkpoint: Path) -> tuple[int, dict]:
    """``new-mlp`` from the checkpoint, ``old-mlp`` of the same size; (obs width, the module's config)."""
    import torch

    from rlserve.models.catalog import build_model
    from rlserve.models.export.exporter import export_bundle
    from rlserve.models.export.from_rlmodule import export_rlmodule
    from rlserve.models.newstack import read_module_checkpoint

    torch.set_num_threads(1)
    module = read_module_checkpoint(checkpoint)
    if module.kind != "ppo" or module.model_config["use_lstm"] or len(module.observation_space.shape) != 1:
        raise SystemExit(f"{checkpoint}: expected a feedforward PPO MLP module, got {module.module_class}")
    export_rlmodule(module, repo / "new-mlp", formats=("onnx",), name="new-mlp", version="1")
    config = {"fcnet_hiddens": list(module.model_config["fcnet_hiddens"]),
              "fcnet_activation": module.model_config["fcnet_activation"], "vf_share_layers": False}
    torch.manual_seed(0)
    model = build_model(module.observation_space, module.action_space, config)
    export_bundle(model, obs_space=module.observation_space, action_space=module.action_space, model_config=config,
                  out_dir=repo / "old-mlp", name="old-mlp", version="1", formats=["onnx"])
    return int(module.observation_space.shape[0]), config


def requests(name: str, dim: int):
    def make(c: int, rng) -> list[list[bytes]]:
        return [[bench._request(f"/v1/models/{name}/act", json.dumps({"observation": bench.obs_row(rng, dim)}).encode())
                 for _ in range(8)] for _ in range(c)]

    return make


def main() -> None:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, default=_default_checkpoint())
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=(os.cpu_count() or 1) >= 2,
                        help="the server on CPU 0, the load generator on CPU 1 (default with >= 2 CPUs)")
    args = parser.parse_args()
    args.repeat = 1
    if args.pin:
        bench.SERVER_CPUS, bench.LOAD_CPUS = {0}, {1}
    rng = np.random.default_rng(0)
    bench.machine_state("start")
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        t0 = time.time()
        dim, config = build_bundles(repo, args.checkpoint)
        print(f"bundles built in {time.time() - t0:.1f}s: new-mlp from {args.checkpoint}, old-mlp {config} "
              f"(obs width {dim})", flush=True)
        proc, port = bench.start_rlserve(repo, {})
        ratios: dict[int, list[float]] = {c: [] for c in args.concurrency}
        try:
            for r in range(args.rounds):
                for c in args.concurrency:
                    order = ("new-mlp", "old-mlp") if r % 2 == 0 else ("old-mlp", "new-mlp")
                    res = {}
                    for name in order:
                        res[name] = bench.measure(port, requests(name, dim), c, rng, args, proc.pid)
                        bench.show(f"round {r + 1} {name}", c, res[name], 1)
                    ratios[c].append(res["new-mlp"]["req_s"] / res["old-mlp"]["req_s"])
        finally:
            bench.stop(proc)
    print("\nnew-stack / old-stack req/s, per round; median:")
    for c, values in ratios.items():
        print(f"  c={c:<3} {' '.join(f'{v:.3f}' for v in values)}   median {statistics.median(values):.3f}")
    bench.machine_state("end")


if __name__ == "__main__":
    main()
