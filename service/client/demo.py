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


def _play(url: str, model: str, env_id: str, args: argparse.Namespace, reset: bool,
          sessions: bool = True) -> list[float]:
    with PolicyClient(url, model, timeout=30.0) as client:
        stats = run_episodes(client, lambda: make_env(env_id), args.episodes, parallel=args.episodes,
                             seed=args.seed, explore=args.explore, reset_state_every_step=reset, sessions=sessions)
    return stats.returns


def _has_memory(url: str, model: str) -> bool:
    """Whether the model carries anything from one step to the next (recurrent or attention
    state, previous actions or rewards): it then needs a server session per episode."""
    with PolicyClient(url, model, timeout=30.0) as client:
        info = client.model_info()
    prev = info.get("prev") or {}
    return bool(info.get("state")) or bool(prev.get("n_prev_actions")) or bool(prev.get("n_prev_rewards"))


def _mean(returns: list[float]) -> str:
    return f"{sum(returns) / len(returns):.1f}"


def _play_model(url: str, model: str, env_id: str, args: argparse.Namespace) -> None:
    """Play ``model``, in sessions when the server keeps them; a policy without memory is
    played without them when it does not (``--workers N`` without a session store)."""
    try:
        returns = _play(url, model, env_id, args, reset=False)
        note = ""
    except RLServeError as exc:
        if exc.code != "sessions_unavailable":
            raise
        if _has_memory(url, model):
            print(f"{model}: skipped: it remembers earlier steps, which needs server sessions, and this "
                  f"server keeps none ({exc.message})")
            return
        returns = _play(url, model, env_id, args, reset=False, sessions=False)
        note = " (stateless requests: this server keeps no sessions)"
    print(f"{model} on {env_id}: returns {[round(r, 1) for r in returns]} mean {_mean(returns)}{note}")
    if env_id == NO_VELOCITY_ID and not note:
        reset = _play(url, model, env_id, args, reset=True)
        print(f"{model} with its state reset every step: mean {_mean(reset)}")


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
            _play_model(args.url, model, env_id, args)
        except RLServeError as exc:
            print(f"{model}: {exc}", file=sys.stderr)
            status = 1
    return status
