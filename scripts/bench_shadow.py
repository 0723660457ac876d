"""Benchmark a shadow candidate's cost to the live path (not a test: it prints numbers).

One server, the bench LSTM (bench_scenarios) as two versions; single-observation session
steps, one session per connection. First the peak: closed-loop load at ``--peak-c``
connections, shadow off. Then, at half that request rate (paced: each of ``--c``
connections sends on a fixed schedule, latency measured from the scheduled send), rounds
with the shadow on and off, alternating the order; the shadow is switched through the
admin API between rounds, so both sides are the same server (each "on" round starts once
the candidate's process has loaded the candidate). Target: live p50 with the
shadow on <= 1.1x off, 0 failed requests. The shadow's counts (rows scored, dropped by a
full queue, skipped; the fraction of the offered rows scored) are printed after each "on" round.

    python scripts/bench_shadow.py [--duration 5] [--rounds 4] [--c 32] [--queue-rows 4096]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

import bench_server  # noqa: E402
from bench_experience import second_version  # noqa: E402
from bench_report import machine_line  # noqa: E402
from bench_server import build_bundles, lstm_sessions, read_answer, run_load, start_rlserve, stop  # noqa: E402

TOKEN = "bench-shadow"


def admin(port: int, method: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/admin/models/lstm/shadow", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def started(port: int, timeout: float = 120.0) -> None:
    """Wait until the shadow's process loaded the candidate (its state leaves ``starting``)."""
    deadline = time.monotonic() + timeout
    while (state := admin(port, "GET")["state"]) == "starting" and time.monotonic() < deadline:
        time.sleep(0.1)
    if state != "running":
        raise SystemExit(f"the shadow did not start: {admin(port, 'GET')}")


async def _paced(port: int, requests: list[bytes], interval: float, start: float, stop_at: float,
                 warm_until: float, latencies: list[float], errors: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    i = 0
    due = start
    while due < stop_at:
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        writer.write(requests[i % len(requests)])
        i += 1
        status, _ = await read_answer(reader)
        done = time.perf_counter()
        if warm_until < due:
            latencies.append(done - due)  # from the scheduled send: a late send counts as waiting
            if status != 200:
                errors.append(status)
        due += interval


def _paced_process(port: int, requests_per_conn: list[list[bytes]], rate: float, duration: float, warmup: float,
                   queue) -> None:
    if bench_server.LOAD_CPUS is not None:
        os.sched_setaffinity(0, bench_server.LOAD_CPUS)

    async def main():
        latencies: list[float] = []
        errors: list[int] = []
        c = len(requests_per_conn)
        interval = c / rate
        start = time.perf_counter() + 0.05
        warm_until, stop_at = start + warmup, start + warmup + duration
        await asyncio.gather(*(_paced(port, reqs, interval, start + k * interval / c, stop_at, warm_until,
                                      latencies, errors) for k, reqs in enumerate(requests_per_conn)))
        return latencies, errors

    queue.put(asyncio.run(main()))


def paced(port: int, rate: float, c: int, args, rng) -> dict:
    queue = mp.get_context("spawn").Queue()
    proc = mp.get_context("spawn").Process(target=_paced_process,
                                           args=(port, lstm_sessions(c, rng), rate, args.duration, args.warmup, queue))
    proc.start()
    latencies, errors = queue.get()
    proc.join()
    latencies.sort()
    n = len(latencies)
    return {"requests": n, "req_s": n / args.duration, "p50_ms": 1e3 * latencies[n // 2],
            "p99_ms": 1e3 * latencies[min(n - 1, int(n * 0.99))], "errors": len(errors)}


def _coverage(counts: dict) -> float:
    """The shadow's rows scored, of all the live rows it was offered (scored, dropped, skipped)."""
    offered = sum(counts.get(k, 0) for k in ("scored", "dropped", "skipped_broken", "skipped_not_admitted"))
    return counts["scored"] / max(1, offered)


def main() -> None:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--c", type=int, default=32, help="connections of the paced load")
    parser.add_argument("--peak-c", type=int, default=64, help="connections of the closed-loop peak")
    parser.add_argument("--queue-rows", type=int, default=4096)
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=(os.cpu_count() or 1) >= 2)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(machine_line())
    if args.pin:
        bench_server.SERVER_CPUS, bench_server.LOAD_CPUS = {0}, {1}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        build_bundles(repo)
        second_version(repo, "lstm")
        proc, port = start_rlserve(repo, {"RLSERVE_ADMIN_TOKEN": TOKEN})
        shadow = {"candidate": {"model": "lstm", "version": "1"}, "version": "2", "queue_rows": args.queue_rows}
        try:
            peak = run_load(port, lstm_sessions(args.peak_c, rng), args.duration, args.warmup, proc.pid)
            print(f"peak (closed loop, c={args.peak_c}, shadow off): {peak['req_s']:.0f} req/s, "
                  f"p50 {peak['p50_ms']:.2f} ms, errors {peak['errors']}")
            rate = peak["req_s"] / 2
            print(f"\nhalf of the peak: {rate:.0f} req/s paced over {args.c} connections, {args.rounds} rounds "
                  f"of {args.duration:g} s a side")
            ratios, failed, covered = [], 0, []
            for i in range(args.rounds):
                got = {}
                for side in (("on", "off") if i % 2 == 0 else ("off", "on")):
                    if side == "on":
                        admin(port, "PUT", shadow)
                        started(port)
                    got[side] = paced(port, rate, args.c, args, rng)
                    if side == "on":
                        counts = admin(port, "DELETE")["counts"]
                failed += got["on"]["errors"] + got["off"]["errors"]
                covered.append(_coverage(counts))
                ratios.append(got["on"]["p50_ms"] / got["off"]["p50_ms"])
                print(f"  round {i + 1}: p50 {got['on']['p50_ms']:.3f} vs {got['off']['p50_ms']:.3f} ms (on/off "
                      f"{ratios[-1]:.2f})  p99 {got['on']['p99_ms']:.2f} vs {got['off']['p99_ms']:.2f} ms  "
                      f"{got['on']['req_s']:.0f} vs {got['off']['req_s']:.0f} req/s  errors "
                      f"{got['on']['errors']}/{got['off']['errors']}  shadow: scored {counts['scored']}, dropped "
                      f"{counts['dropped']}, skipped {counts['skipped_broken']}, failed {counts['failed']}, "
                      f"not admitted {counts['skipped_not_admitted']}, scored of offered {_coverage(counts):.0%}",
                      flush=True)
            print(f"\nlive p50 shadow on / off: median {statistics.median(ratios):.2f} (target <= 1.1), rounds "
                  f"meeting it {sum(r <= 1.1 for r in ratios)}/{len(ratios)}; failed requests {failed}; rows the "
                  f"shadow scored of those offered: median {statistics.median(covered):.0%}")
        finally:
            stop(proc)


if __name__ == "__main__":
    main()
