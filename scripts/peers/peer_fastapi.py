"""The benchmark's policy served by a plain FastAPI app with eager torch, no batching.

What a user writes first: one path operation that runs the network per request. It is a
plain ``def`` because the network blocks (FastAPI's advice for blocking calls: it runs
them in its thread pool), served by uvicorn with uvloop and httptools (``uvicorn[standard]``),
one worker, access log off. The LSTM's per-session state is a dict in this one process
(policy_net.Policy).

    python scripts/peers/peer_fastapi.py --model mlp --weights W.pt --port 8101
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import uvicorn  # noqa: E402
from fastapi import Body, FastAPI  # noqa: E402
from peer_cli import peer_args  # noqa: E402
from policy_net import Policy  # noqa: E402


def make_app(policy: Policy) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, bool]:
        return {"ok": True}

    @app.post("/act")
    def act(body: dict[str, Any] = Body()) -> dict[str, Any]:  # noqa: B008  (FastAPI's own idiom)
        return policy.act_bodies([body])[0]

    return app


def main() -> None:
    args = peer_args(__doc__)  # --max-batch and --wait-s: no batching here
    app = make_app(Policy(args.model, args.weights))
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
