"""`rlserve demo`: play the embedded default policies over HTTP and print the returns.

Start the service in one terminal (`rlserve serve`), then run `rlserve demo` in another.
For the memory policy it also plays the same episodes with the server-side state reset
at every step, which is what the policy scores without memory.
"""

from __future__ import annotations

import argparse
import os
import sys

import httpx

from rlserve.client.envs import DEFAULT_POLICY_ENVS, NO_VELOCITY_ID, make_env
from rlserve.client.gym_runner import run_episodes
from rlserve.client.policy_client import PolicyClient, RLServeError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlserve demo", description=__doc__.split("\n")[0])
    default_url = os.environ.get("RLSERVE_URL") or f"http://127.0.0.1:{os.environ.get('RLSERVE_PORT', '8000')}"
    parser.add_argument("--url", default=default_url,
                        help="service base URL (default $RLSERVE_URL, else http://127.0.0.1:$RLSERVE_PORT or :8000)")
    parser.add_argument("--episodes", type=int, default=5, help="episodes per policy (default 5)")
    parser.add_argument("--models", default=",".join(DEFAULT_POLICY_ENVS),
                        help="comma-separated models to play (default: the embedded ones)")
    parser.add_argument("--explore", action="store_true", help="sample actions instead of the mode")
    parser.add_argument("--seed", type=int, default=0, help="first environment seed")
    return parser


def _play(url: str, model: str, env_id: str, args: argparse.Namespace, reset: bool) -> list[float]:
    with PolicyClient(url, model, timeout=30.0) as client:
        stats = run_episodes(client, lambda: make_env(env_id), args.episodes, parallel=args.episodes,
                             seed=args.seed, explore=args.explore, reset_state_every_step=reset)
    return stats.returns


def demo_main(argv: list[str]) -> int:
    """``rlserve demo ARGS``: play each model's episodes and print the returns; 0 when all played."""
    args = _parser().parse_args(argv)
    try:
        served = {m["name"] for m in httpx.get(f"{args.url}/v1/models", timeout=10).json()["models"]}
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        print(f"rlserve demo: cannot list models at {args.url}: {exc}\n"
              "Start the service first: rlserve serve", file=sys.stderr)
        return 1
    status = 0
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        env_id = DEFAULT_POLICY_ENVS.get(model)
        if env_id is None or model not in served:
            why = "not served" if model not in served else "no known environment"
            print(f"{model}: skipped ({why})")
            status = 1
            continue
        try:
            returns = _play(args.url, model, env_id, args, reset=False)
            print(f"{model} on {env_id}: returns {[round(r, 1) for r in returns]} "
                  f"mean {sum(returns) / len(returns):.1f}")
            if env_id == NO_VELOCITY_ID:
                reset = _play(args.url, model, env_id, args, reset=True)
                print(f"{model} with its state reset every step: mean {sum(reset) / len(reset):.1f}")
        except RLServeError as exc:
            print(f"{model}: {exc}", file=sys.stderr)
            status = 1
    return status
