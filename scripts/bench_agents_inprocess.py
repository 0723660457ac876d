"""bench_agents.py's throughput question without HTTP: where the policy set's rows stop.

Not a test: it prints numbers and the machine. The same app ``rlserve serve`` builds (the
LSTM 256 bundle as ``lstm`` and as the set ``team``'s only policy ``team.p``), called in
this process: each pre-built request of bench_agents.py's scenarios goes straight to the
use case (``AgentsActService.agents_act``, ``ActService.act``), many at once on one event
loop, so the batches form as on the server. What it measures is the act path's CPU per
row (decode, the episode, checks, sessions, the batcher, ONNX Runtime, the answer) with
HTTP's share at zero: an upper bound for what bench_agents.py's throughput ratio can reach
with this path whatever the HTTP layer costs.

    python scripts/bench_agents_inprocess.py [--seconds 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_agents  # noqa: E402  (the scenarios and the set)
import bench_server  # noqa: E402  (machine_state)

SCENARIOS = {  # label -> (requests' builder, connections, rows per request)
    "64 clients x 8 agents": (bench_agents.agents8, 64, bench_agents.AGENTS),
    "8 clients x 64-row requests": (bench_agents.sessions64, 8, 64),
    "64 clients x plain 8-row requests": (bench_agents.sessions8, 64, bench_agents.AGENTS),
}
_ACT = "/act"


def _calls(app, requests: list[bytes]) -> list:
    """Each pre-built HTTP request as a call of its use case."""
    agents, act = app.state.agents_service, app.state.act_service
    calls = []
    for request in requests:
        head, body = request.split(b"\r\n\r\n", 1)
        path = head.split(b" ")[1].decode()
        name = path.split("/")[3]
        if path.endswith("/agents/act"):
            calls.append(lambda body=body, name=name: agents.agents_act(name, body))
        else:
            assert path.endswith(_ACT), path
            calls.append(lambda body=body, name=name: act.act(name, None, body))
    return calls


async def _drive(app, per_connection: list[list[bytes]], seconds: float) -> tuple[float, int]:
    """(CPU seconds, requests answered) of the connections' closed loops for ``seconds``."""
    connections = [_calls(app, requests) for requests in per_connection]
    for calls in connections:  # each connection's first request starts its episodes
        await calls[0]()
    stop = time.perf_counter() + seconds
    answered = 0

    async def loop(calls: list) -> None:
        nonlocal answered
        index = 1
        while time.perf_counter() < stop:
            await calls[index]()
            index = index + 1 if index + 1 < len(calls) else 1
            answered += 1

    started = time.process_time()
    await asyncio.gather(*(loop(calls) for calls in connections))
    return time.process_time() - started, answered


async def _measure(app, seconds: float, rounds: int, rng) -> dict[str, list[float]]:
    per_row: dict[str, list[float]] = {label: [] for label in SCENARIOS}
    labels = list(SCENARIOS)
    for round_ in range(rounds):
        for label in labels[round_ % 3:] + labels[:round_ % 3]:
            make, connections, rows = SCENARIOS[label]
            cpu, answered = await _drive(app, make(connections, rng), seconds)
            per_row[label].append(1e6 * cpu / (answered * rows))
            print(f"round {round_ + 1} {label:>34}: {per_row[label][-1]:6.1f} us of CPU per row "
                  f"({answered} requests)", flush=True)
    return per_row


def main() -> None:
    import numpy as np

    from rlserve.service.app import create_app
    from rlserve.service.server import settle_heap
    from rlserve.service.settings import Settings

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="per scenario and round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the scenarios' order rotating")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True, help="run on CPU 0")
    args = parser.parse_args()
    if args.pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    bench_server.machine_state("start")
    with tempfile.TemporaryDirectory(prefix="rlserve-bench-agents-inprocess-") as tmp:
        repo = bench_agents.build_set(Path(tmp))
        app = create_app(Settings(repository=repo, policy_sets=[str(Path(tmp) / "team")],
                                  log_level="warning"))
        settle_heap()  # the collector's settings ``rlserve serve`` uses once its models are loaded
        per_row = asyncio.run(_measure(app, args.seconds, args.rounds, np.random.default_rng(0)))
    medians = {label: statistics.median(values) for label, values in per_row.items()}
    base = medians["8 clients x 64-row requests"]
    for label, value in medians.items():
        print(f"median {label:>34}: {value:6.1f} us per row; rows/s relative to 64-row requests "
              f"{base / value:.2f}", flush=True)


if __name__ == "__main__":
    main()
