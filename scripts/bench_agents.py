"""Benchmark a policy set (multi-agent act) against the same rows sent as single-policy requests.

Not a test: it prints numbers and the machine. One ``rlserve serve`` (bench_server.py's
bundles, servers, pinning and closed-loop load generator, imported) serves the LSTM 256
bundle as the model ``lstm`` and, as the only policy of a set ``team``, as ``team.p``; every
agent and every single-policy row has its own session (recurrent state on the server).
Two questions, each answered by interleaved pairs on the same server:

- cost: one request carrying 8 agents of one policy (one episode per connection) against
  one single-agent session request, server CPU per request at the same concurrency
  (target: at most 2x);
- throughput: 64 connections x 8 agents against the same rows as 64-row single-policy
  requests (8 connections, a session per row), observations per second (target: >= 0.8x).

    python scripts/bench_agents.py [--duration 5] [--rounds 5] [--cost-concurrency 1 16] [--code CHECKOUT]

``--code CHECKOUT`` serves with another checkout's code (bench_server.py's ``--baseline``
path), so that runs of a change and of its parent can alternate on the same machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_server as bench  # noqa: E402

AGENTS = 8


def _agents_act(episode: str, observations: list[list[float]], start: bool) -> bytes:
    body = {"episode_id": episode, "agents": {f"agent_{i}": {"observation": obs, **({} if start else {"reward": 1.0})}
                                              for i, obs in enumerate(observations)}}
    if start:
        body["episode_start"] = True
    return bench._request("/v1/models/team/agents/act", json.dumps(body).encode())


def agents8(c: int, rng) -> list[list[bytes]]:
    """Each connection one episode of 8 agents (of the one policy), every request all 8."""
    out = []
    for k in range(c):
        episode = f"bench-{k}-{rng.integers(1 << 30)}"
        first = _agents_act(episode, [bench.obs_row(rng) for _ in range(AGENTS)], True)
        steps = [_agents_act(episode, [bench.obs_row(rng) for _ in range(AGENTS)], False) for _ in range(8)]
        out.append([first] + steps * 50)
    return out


def sessions64(c: int, rng) -> list[list[bytes]]:
    """The same rows as 64-row single-policy requests: a session per row."""
    def one(ids: list[str], start: bool) -> bytes:
        body = {"observations": [bench.obs_row(rng) for _ in range(64)], "session_ids": ids}
        body.update({"episode_starts": [True] * 64} if start else {"rewards": [1.0] * 64})
        return bench._request("/v1/models/lstm/act", json.dumps(body).encode())

    out = []
    for k in range(c):
        ids = [f"rows-{k}-{i}-{rng.integers(1 << 30)}" for i in range(64)]
        out.append([one(ids, True)] + [one(ids, False) for _ in range(8)] * 50)
    return out


def sessions8(c: int, rng) -> list[list[bytes]]:
    """For reference: the 8 agents' rows as one plain 8-row act request (a session per row),
    i.e. the same request granularity without the policy set's layer."""
    def one(ids: list[str], start: bool) -> bytes:
        body = {"observations": [bench.obs_row(rng) for _ in range(AGENTS)], "session_ids": ids}
        body.update({"episode_starts": [True] * AGENTS} if start else {"rewards": [1.0] * AGENTS})
        return bench._request("/v1/models/team.p/act", json.dumps(body).encode())

    out = []
    for k in range(c):
        ids = [f"plain-{k}-{i}-{rng.integers(1 << 30)}" for i in range(AGENTS)]
        out.append([one(ids, True)] + [one(ids, False) for _ in range(8)] * 50)
    return out


def build_set(workdir: Path) -> Path:
    from rlserve.models.export.policy_set_export import policy_set_from_bundles
    from rlserve.models.multiagent.mapping import AgentMapping

    repo = workdir / "repo"
    bench.build_bundles(repo)
    (repo / "mlp").rename(workdir / "mlp-unused")  # only the LSTM is served
    with policy_set_from_bundles({"p": repo / "lstm"}, workdir / "team", AgentMapping(default="p"), name="team"):
        pass
    return repo


def main() -> None:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved pairs per question (A B, then B A, ...)")
    parser.add_argument("--cost-concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                        help="server on CPU 0, load generator on CPU 1 (bench_server.py's pinning)")
    parser.add_argument("--code", type=Path, default=None, metavar="CHECKOUT",
                        help="serve with this checkout's rlserve code instead of this one's")
    args = parser.parse_args()
    if args.pin:
        bench.SERVER_CPUS, bench.LOAD_CPUS = {0}, {1}
    rng = np.random.default_rng(0)
    bench.machine_state("start")
    with tempfile.TemporaryDirectory(prefix="rlserve-bench-agents-") as tmp:
        repo = build_set(Path(tmp))
        env = {"RLSERVE_POLICY_SETS": json.dumps([str(Path(tmp) / "team")])}
        code_root = None if args.code is None else bench.baseline_root(args.code, Path(tmp))
        print(f"server code: {args.code or bench.ROOT}", flush=True)
        proc, port = bench.start_rlserve(repo, env, code_root)
        try:
            plain = (f"plain {AGENTS}-row request, sessions", sessions8, AGENTS)
            for c in args.cost_concurrency:
                ratios = _pairs(port, proc.pid, args, rng, c, ("1 agent, session", bench.lstm_sessions, 1),
                                (f"{AGENTS} agents, episode", agents8, AGENTS), "cpu_us", plain)
                _report(f"cost c={c}: server CPU per request, {AGENTS} agents / 1 agent", ratios, "<= 2")
            ratios = _pairs(port, proc.pid, args, rng, None, ("64-row requests, c=8", sessions64, 64),
                            (f"{AGENTS} agents, c=64", agents8, AGENTS), "obs_s", plain)
            _report(f"throughput: obs/s, 64 clients x {AGENTS} agents / 8 clients x 64-row requests", ratios,
                    ">= 0.8")
        finally:
            bench.stop(proc)
    bench.machine_state("end")


def _report(question: str, ratios: list[tuple[float, float]], target: str) -> None:
    """Each round's ratio of the policy set, and of the plain request of the same rows (reference)."""
    sets, plains = [r[0] for r in ratios], [r[1] for r in ratios]
    print(f"{question}: median {statistics.median(sets):.2f} (rounds {', '.join(f'{r:.2f}' for r in sets)}; "
          f"target {target}); the same rows as one plain {AGENTS}-row request: median "
          f"{statistics.median(plains):.2f}", flush=True)


def _pairs(port: int, pid: int, args: argparse.Namespace, rng, c: int | None, base: tuple, multi: tuple,
           figure: str, plain: tuple) -> list[tuple[float, float]]:
    """``rounds`` rounds of (base, multi, plain), the order rotating; (multi/base, plain/base) of
    ``figure`` per round. ``c`` None: the throughput question (base at 8 connections, the others at 64)."""
    ratios = []
    for round_ in range(args.rounds):
        results = {}
        scenarios = [base, multi, plain]
        order = scenarios[round_ % 3:] + scenarios[:round_ % 3]
        for label, make, rows in order:
            conns = c if c is not None else (8 if make is sessions64 else 64)
            res = bench.run_load(port, make(conns, rng), args.duration, args.warmup, pid)
            res["obs_s"] = res["req_s"] * rows
            bench.show(label, conns, res, rows)
            results[label] = res
        ratios.append((results[multi[0]][figure] / results[base[0]][figure],
                       results[plain[0]][figure] / results[base[0]][figure]))
    return ratios


if __name__ == "__main__":
    main()
