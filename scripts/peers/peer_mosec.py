"""The benchmark's policy served by mosec, with its dynamic batching.

One worker stage (mosec's Rust server takes the HTTP requests and batches them for the
Python worker process): ``forward`` gets the JSON-decoded bodies of a batch (mosec's
default deserialization) and answers one dict per body. Configured with
``append_worker(max_batch_size=..., max_wait_time=...)``, mosec's dynamic batching, one
worker process (one core); the address is 127.0.0.1 (``MOSEC_ADDRESS``), the port comes
from the command line (``--port``, which mosec reads too). The LSTM's per-session state is
a dict in the one worker process (policy_net.Policy).

    python scripts/peers/peer_mosec.py --model mlp --weights W.pt --port 8104
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mosec import Server, Worker  # noqa: E402
from peer_cli import peer_args  # noqa: E402
from policy_net import Policy  # noqa: E402


class PolicyWorker(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.policy = Policy(os.environ["PEER_MODEL"], os.environ["PEER_WEIGHTS"])

    def forward(self, data: list[dict]) -> list[dict]:
        return self.policy.act_bodies(data)


def main() -> None:
    args = peer_args(__doc__)
    os.environ.setdefault("MOSEC_ADDRESS", "127.0.0.1")
    os.environ.setdefault("MOSEC_LOG_LEVEL", "warning")
    server = Server()
    server.append_worker(PolicyWorker, num=1, max_batch_size=args.max_batch,
                         max_wait_time=max(1, round(args.wait_s * 1000)),
                         env=[{"PEER_MODEL": args.model, "PEER_WEIGHTS": args.weights}])
    server.run()


if __name__ == "__main__":
    main()
