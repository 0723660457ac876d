"""The benchmark's policy served by LitServe, with its request batching.

A LitAPI whose ``predict`` gets the decoded bodies of a batch (``batch`` keeps them a list:
they are dicts, one or 64 observations each) and answers one dict per body. Configured as
LitServe's own notes say for throughput on this hardware: ``max_batch_size`` and
``batch_timeout`` on the LitAPI, ``fast_queue=True`` (ZeroMQ between the API server and the
worker, "for high-throughput scenarios"), one inference worker on the CPU and one API
server (its default: as many as workers). ``batch_timeout`` is not 0, which would make the
worker poll its queue without blocking. The LSTM's per-session state is a dict in the one
inference worker (policy_net.Policy).

    python scripts/peers/peer_litserve.py --model mlp --weights W.pt --port 8102
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import litserve as ls  # noqa: E402
from peer_cli import peer_args  # noqa: E402
from policy_net import Policy  # noqa: E402


class PolicyAPI(ls.LitAPI):
    def __init__(self, model: str, weights: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.model_name, self.weights = model, weights

    def setup(self, device: str) -> None:
        self.policy = Policy(self.model_name, self.weights)

    def decode_request(self, request: dict) -> dict:
        return request

    def batch(self, inputs: list[dict]) -> list[dict]:
        return inputs

    def predict(self, bodies: list[dict]) -> list[dict]:
        return self.policy.act_bodies(bodies)

    def unbatch(self, output: list[dict]) -> list[dict]:
        return output

    def encode_response(self, output: dict) -> dict:
        return output


def main() -> None:
    args = peer_args(__doc__)
    api = PolicyAPI(args.model, args.weights, max_batch_size=args.max_batch, batch_timeout=args.wait_s)
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1, fast_queue=True)
    server.run(host="127.0.0.1", port=args.port, log_level="warning", generate_client_file=False)


if __name__ == "__main__":
    main()
