"""The benchmark's policy served by Ray Serve, with ``@serve.batch``.

One deployment, one replica (one core), behind Ray Serve's HTTP proxy on 127.0.0.1. Its
``__call__`` reads the JSON body and awaits a ``@serve.batch`` method, which gets the bodies
of a batch and answers one dict per body: Ray Serve's documented way to batch requests.
``max_ongoing_requests`` is raised above the batch size and the clients' concurrency, as
Ray's batching guide asks (its default, 5, would cap a batch at 5), and Serve runs with
``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``, the switch its performance guide gives for throughput. The LSTM's per-session
state is a dict in the one replica (policy_net.Policy). A GET answers ``{"ok": true}``: the
readiness check. Ray runs on 127.0.0.1 (``_node_ip_address``), without its dashboard and
without usage reporting.

    python scripts/peers/peer_rayserve.py --model mlp --weights W.pt --port 8103
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report leaves the machine
# Ray Serve's throughput profile (its performance guide): user code on the replica's own event
# loop, no separate router loop, no per-request log lines on stderr, gRPC between proxy and replica.
os.environ.setdefault("RAY_SERVE_THROUGHPUT_OPTIMIZED", "1")

import ray  # noqa: E402
from peer_cli import peer_args  # noqa: E402
from policy_net import Policy  # noqa: E402
from ray import serve  # noqa: E402
from starlette.requests import Request  # noqa: E402

MAX_ONGOING = 256


def make_deployment(max_batch: int, wait_s: float) -> serve.Deployment:
    @serve.deployment(max_ongoing_requests=MAX_ONGOING, ray_actor_options={"num_cpus": 1})
    class PolicyDeployment:
        def __init__(self, model: str, weights: str) -> None:
            self.policy = Policy(model, weights)

        @serve.batch(max_batch_size=max_batch, batch_wait_timeout_s=wait_s)
        async def act(self, bodies: list[dict]) -> list[dict]:
            return self.policy.act_bodies(bodies)

        async def __call__(self, request: Request) -> dict:
            if request.method == "GET":
                return {"ok": True}
            return await self.act(await request.json())

    return PolicyDeployment


def main() -> None:
    args = peer_args(__doc__)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             object_store_memory=200 * 1024 * 1024,
             runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parent),
                                       "RAY_SERVE_THROUGHPUT_OPTIMIZED": os.environ["RAY_SERVE_THROUGHPUT_OPTIMIZED"]}})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        app = make_deployment(args.max_batch, args.wait_s).bind(args.model, args.weights)
        serve.run(app, route_prefix="/act", blocking=False)
        print("ready", flush=True)
        signal.pause()
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
