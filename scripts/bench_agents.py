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
  requests (8 connections, a session per row), observations per second (target: >= 0.8x),
  over HTTP and over the policy set's stream (``/v1/models/team/agents/stream``, one episode
  per connection, JSON text frames pre-encoded like the HTTP bodies; bench_ws.py's client).

    python scripts/bench_agents.py [--duration 5] [--rounds 5] [--cost-concurrency [1 16]] [--no-budget]
        [--code CHECKOUT]

Every scenario line is followed by its batches' work per row (the model, sampling, state:
the server's ``rlserve_batch_run_seconds`` over its rows). Then, unless ``--no-budget``, the
throughput target as a budget: the server CPU an 8-agent request may cost at 0.8, less its
rows' batch work, against what HTTP alone costs on the same bodies (bench_server.py's minimal
uvicorn app, which reads the body and answers a fixed one) and what the rest of rlserve's
request costs now.

``--code CHECKOUT`` serves with another checkout's code (bench_server.py's ``--baseline``
path), so that runs of a change and of its parent can alternate on the same machine.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_server as bench  # noqa: E402
from bench_ws import ws_frame  # noqa: E402

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


def agents8_stream(c: int, rng) -> list[list[bytes]]:
    """``agents8`` over the policy set's stream: the upgrade, then one frame per step (the
    first starts the episode)."""
    out = []
    for _ in range(c):
        key = base64.b64encode(rng.bytes(16))
        upgrade = (b"GET /v1/models/team/agents/stream HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\n"
                   b"connection: Upgrade\r\nsec-websocket-key: " + key + b"\r\nsec-websocket-version: 13\r\n\r\n")

        def step(start: bool) -> bytes:
            agents = {f"agent_{i}": {"observation": bench.obs_row(rng), **({} if start else {"reward": 1.0})}
                      for i in range(AGENTS)}
            return ws_frame(json.dumps({"agents": agents}).encode())

        out.append([upgrade, step(True)] + [step(False) for _ in range(8)])
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
    parser.add_argument("--cost-concurrency", type=int, nargs="*", default=[1, 16],
                        help="concurrencies of the cost question (none: only the throughput question)")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                        help="server on CPU 0, load generator on CPU 1 (bench_server.py's pinning)")
    parser.add_argument("--budget", action=argparse.BooleanOptionalAction, default=True,
                        help="after the throughput question, what 0.8 leaves an 8-agent request besides its batch, "
                             "and what HTTP alone costs (a minimal uvicorn app, same bodies)")
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
            rounds: list[dict] = []
            ratios = _pairs(port, proc.pid, args, rng, None, ("64-row requests, c=8", sessions64, 64),
                            (f"{AGENTS} agents, c=64", agents8, AGENTS), "obs_s", plain, rounds,
                            stream=(f"{AGENTS} agents, stream, c=64", agents8_stream, AGENTS))
            _report(f"throughput: obs/s, 64 clients x {AGENTS} agents / 8 clients x 64-row requests", ratios,
                    ">= 0.8")
            streamed = [r[2] for r in ratios]
            print(f"throughput over the stream: obs/s, 64 streams x {AGENTS} agents / 8 clients x 64-row requests: "
                  f"median {statistics.median(streamed):.2f} (rounds {', '.join(f'{r:.2f}' for r in streamed)}; "
                  "target >= 0.8)", flush=True)
        finally:
            bench.stop(proc)
        if args.budget:
            _budget(rounds, args, rng, Path(tmp))
    bench.machine_state("end")


def _batch_totals(port: int) -> tuple[float, float]:
    """(seconds spent in batches, rows they ran), all models together, from the server's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    sums = {"run_seconds": 0.0, "size_rows": 0.0}
    for kind, value in re.findall(r'^rlserve_batch_(run_seconds|size_rows)_sum\{[^}]*\} (\S+)$', text, re.M):
        sums[kind] += float(value)
    return sums["run_seconds"], sums["size_rows"]


def _budget(rounds: list[dict], args: argparse.Namespace, rng, workdir: Path) -> None:
    """What the throughput target leaves an 8-agent request outside its batch, against what
    HTTP alone costs: the same 8-agent bodies sent to bench_server.py's minimal uvicorn app
    (it reads the body and answers a fixed one, parsing nothing), pinned the same way."""
    multi = f"{AGENTS} agents, c=64"
    per_row_64 = statistics.median(r["64-row requests, c=8"]["cpu_us"] / 64 for r in rounds)
    allowed = AGENTS * per_row_64 / 0.8
    batch = statistics.median(r[multi]["batch_us_per_row"] for r in rounds) * AGENTS
    spent = statistics.median(r[multi]["cpu_us"] for r in rounds)
    proc, port = bench.start_minimal(workdir)
    try:
        http = statistics.median(bench.run_load(port, agents8(64, rng), args.duration, args.warmup, proc.pid)["cpu_us"]
                                 for _ in range(args.rounds))
    finally:
        bench.stop(proc)
    print(f"budget at 0.8: an {AGENTS}-agent request may cost {allowed:.0f} us of server CPU ({AGENTS} x the 64-row "
          f"request's {per_row_64:.1f} per row / 0.8); its {AGENTS} rows' batch work (the model, sampling, state) "
          f"takes {batch:.0f}, which leaves {allowed - batch:.0f} us for the rest of the request. A uvicorn app that "
          f"parses nothing spends {http:.0f} us per request on the same bodies at c=64; rlserve's request outside "
          f"its batch costs {spent - batch:.0f} us now (medians of {len(rounds)} rounds)", flush=True)


def _report(question: str, ratios: list[tuple[float, ...]], target: str) -> None:
    """Each round's ratio of the policy set, and of the plain request of the same rows (reference)."""
    sets, plains = [r[0] for r in ratios], [r[1] for r in ratios]
    print(f"{question}: median {statistics.median(sets):.2f} (rounds {', '.join(f'{r:.2f}' for r in sets)}; "
          f"target {target}); the same rows as one plain {AGENTS}-row request: median "
          f"{statistics.median(plains):.2f}", flush=True)


def _pairs(port: int, pid: int, args: argparse.Namespace, rng, c: int | None, base: tuple, multi: tuple,
           figure: str, plain: tuple, rounds: list[dict] | None = None,
           stream: tuple | None = None) -> list[tuple[float, ...]]:
    """``rounds`` rounds of (base, multi, plain[, stream]), the order rotating; (multi/base,
    plain/base[, stream/base]) of ``figure`` per round. ``c`` None: the throughput question
    (base at 8 connections, the others at 64). Each round's results (with the batches' time
    per row, from /metrics) go to ``rounds`` if given."""
    ratios = []
    for round_ in range(args.rounds):
        results = {}
        scenarios = [base, multi, plain] + ([] if stream is None else [stream])
        turn = round_ % len(scenarios)
        order = scenarios[turn:] + scenarios[:turn]
        for label, make, rows in order:
            conns = c if c is not None else (8 if make is sessions64 else 64)
            s0, r0 = _batch_totals(port)
            res = bench.run_load(port, make(conns, rng), args.duration, args.warmup, pid,
                                 stream=make is agents8_stream)
            res["obs_s"] = res["req_s"] * rows
            s1, r1 = _batch_totals(port)  # one scenario runs at a time: its model's batches
            res["batch_us_per_row"] = 1e6 * (s1 - s0) / max(r1 - r0, 1.0)
            bench.show(label, conns, res, rows)
            print(f"{'':<44} batch work (the model, sampling, state): {res['batch_us_per_row']:.1f} us per row",
                  flush=True)
            results[label] = res
        if rounds is not None:
            rounds.append(results)
        ratios.append(tuple(results[s[0]][figure] / results[base[0]][figure]
                            for s in (multi, plain, *(() if stream is None else (stream,)))))
    return ratios


if __name__ == "__main__":
    main()
