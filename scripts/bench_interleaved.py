"""Two servers under the same load, taking turns in short slices (a helper of the benchmarks,
not a test).

Why: on the development VM the CPU's own speed drifts by more than the effects the paired
benchmarks measure. A pure Python loop pinned to one core took 1.5 to 2.8 ms per
iteration in consecutive 3-second rounds (2026-11-30, nothing else of ours running), and
one server under the same load used 170 to 253 us of CPU per request from one 4-second
round to the next. Rounds of several seconds a side then compare two different machines.
Slices of a fraction of a second, in the order A B B A, A B B A, ..., put both sides under
nearly the same machine speed, and a drift that is linear over four slices cancels.

One load process (pinned to ``bench_server.LOAD_CPUS``) holds ``c`` keep-alive connections
to each server. In a slice it drives only one side's connections, closed loop (one request
in flight on each), stops sending at the slice's end and waits for the answers in flight.
Each side's sessions go on where its last slice left them.

What is measured per side: answers and the slices' wall time (drains included) give
requests/s; the server's process tree's CPU time (``bench_procs.tree_cpu_seconds``, read at
both ends of the run) over its answers gives CPU per request;
latencies give p50 and p99. The CPU figure is the one to trust when one side has work that
runs after its answers (a writer thread, a shadow's process): work left at the end of a
slice runs while the other side has its turn on the same core, so it lowers the other
side's requests/s, but it is still counted in its own server's CPU. On a saturated core a
server's sustained requests/s is the inverse of its CPU per request.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import statistics
import time

import bench_server
from bench_procs import tree_cpu_seconds
from bench_server import read_answer


def order(slices: int) -> list[int]:
    """Side of each slice: A B B A repeated, ``slices`` a side."""
    pattern = [0, 1, 1, 0]
    return [pattern[k % 4] for k in range(2 * slices)]


async def _drive(conns: list, requests: list[list[bytes]], positions: list[int], until: float,
                 latencies: list[float], errors: list[int]) -> int:
    async def one(k: int) -> int:
        reader, writer = conns[k]
        cycle, count = requests[k], 0
        while time.perf_counter() < until:
            start = time.perf_counter()
            writer.write(cycle[positions[k] % len(cycle)])
            positions[k] += 1
            status, _ = await read_answer(reader)
            latencies.append(time.perf_counter() - start)
            if status != 200:
                errors.append(status)
            count += 1
        return count

    return sum(await asyncio.gather(*(one(k) for k in range(len(conns)))))


def _load(ports: list[int], pids: list[int], requests: list[list[list[bytes]]], slices: int,
          slice_s: float, warmup_s: float, queue) -> None:
    if bench_server.LOAD_CPUS is not None:
        os.sched_setaffinity(0, bench_server.LOAD_CPUS)
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass

    async def main() -> list[dict]:
        conns = [[await asyncio.open_connection("127.0.0.1", port) for _ in side]
                 for port, side in zip(ports, requests, strict=True)]
        positions = [[0] * len(side) for side in requests]
        for s in range(len(ports)):  # warm-up, not counted
            await _drive(conns[s], requests[s], positions[s], time.perf_counter() + warmup_s, [], [])
        sides = [{"requests": 0, "seconds": 0.0, "latencies": [], "errors": [], "slices": []} for _ in ports]
        cpu = [tree_cpu_seconds(pid) for pid in pids]
        for s in order(slices):
            side = sides[s]
            start = time.perf_counter()
            count = await _drive(conns[s], requests[s], positions[s], start + slice_s, side["latencies"],
                                 side["errors"])
            took = time.perf_counter() - start
            side["requests"] += count
            side["seconds"] += took
            side["slices"].append(count / took)
        cpu = [tree_cpu_seconds(pid) - before for pid, before in zip(pids, cpu, strict=True)]
        for conn in conns:
            for _, writer in conn:
                writer.close()
        out = []
        for side, used in zip(sides, cpu, strict=True):
            lat = sorted(side["latencies"])
            n = len(lat)
            out.append({"requests": side["requests"], "req_s": side["requests"] / side["seconds"],
                        "cpu_us": 1e6 * used / max(1, side["requests"]),
                        "p50_ms": 1e3 * lat[n // 2] if n else float("nan"),
                        "p99_ms": 1e3 * lat[min(n - 1, int(n * 0.99))] if n else float("nan"),
                        "errors": len(side["errors"]), "slices": side["slices"]})
        return out

    try:
        queue.put(asyncio.run(main()))
    except BaseException as exc:  # the parent must not wait forever on a dead generator
        queue.put(exc)
        raise


def interleaved(servers: list[tuple[int, int]], requests: list[list[list[bytes]]], *, slices: int,
                slice_s: float, warmup_s: float) -> list[dict]:
    """Load two servers (``(port, pid)`` each) in turns; ``requests[side][conn]``: the cycle
    of requests each connection sends. Per side: requests, req_s, cpu_us (per request),
    p50_ms, p99_ms, errors and each slice's requests/s (``slices``, in order)."""
    pids = [pid for _, pid in servers]
    context = mp.get_context("spawn")
    queue = context.Queue()
    proc = context.Process(target=_load, args=([port for port, _ in servers], pids, requests, slices, slice_s,
                                               warmup_s, queue))
    proc.start()
    result = queue.get()
    proc.join()
    if isinstance(result, BaseException):
        raise RuntimeError("load generator failed") from result
    return result


def block_ratios(a: dict, b: dict) -> list[float]:
    """A's requests/s over B's per block of four slices (A B B A: two slices a side)."""
    sa, sb = a["slices"], b["slices"]
    return [(sa[i] + sa[i + 1]) / (sb[i] + sb[i + 1]) for i in range(0, min(len(sa), len(sb)) - 1, 2)]


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return (values[0],) * 3 if values else (float("nan"),) * 3
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]
