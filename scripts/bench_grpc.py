"""The Open Inference Protocol over gRPC against REST, 64 observations per request.

One `rlserve serve --grpc-port` process (pinned to CPU 0, the load generator to CPU 1, as
in bench_server.py) serves the 16-float -> 256x256 MLP of bench_server.py. In interleaved
rounds, each at every concurrency, it measures:

- JSON: 64 observation lists per act request (bench_server.py's ``batch64``);
- OIP binary: one FP32 tensor over REST's binary tensor data (``infer64``);
- gRPC: the same tensor in ``raw_input_contents`` of a ``ModelInferRequest`` built with
  tritonclient's own generated messages, sent by a grpc.aio channel (``c`` calls in flight
  on one HTTP/2 connection, as one ``tritonclient.grpc.aio`` client would);
- gRPC stream: the same requests on one ``ModelStreamInfer`` stream, ``c`` in flight.

and prints observations/s and the server's CPU per request, per round and as medians.

    python scripts/bench_grpc.py [--duration 4] [--rounds 3] [--concurrency 1 16 64]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

import bench_server as bench  # noqa: E402

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
MODEL_STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"


def grpc_requests(c: int, rng) -> list[list[bytes]]:
    """Serialized ModelInferRequests: 64 rows of FP32 raw input, action and logp asked for."""
    import numpy as np
    from tritonclient.grpc import service_pb2

    def one() -> bytes:
        obs = np.array([bench.obs_row(rng) for _ in range(64)], dtype=np.float32)
        request = service_pb2.ModelInferRequest(model_name="mlp")
        request.inputs.add(name="obs", datatype="FP32", shape=list(obs.shape))
        request.raw_input_contents.append(obs.tobytes())
        request.outputs.add(name="action")
        request.outputs.add(name="logp")
        return request.SerializeToString()

    return [[one() for _ in range(4)] for _ in range(c)]


def _grpc_load(address: str, requests_per_call: list[list[bytes]], duration: float, warmup: float, queue,
               cpus: set[int] | None, stream: bool = False) -> None:
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    import grpc

    async def main() -> tuple[list[float], int, int]:
        latencies: list[float] = []
        counts = [0, 0]  # answered, failed
        async with grpc.aio.insecure_channel(address, options=[("grpc.max_receive_message_length", -1)]) as channel:
            call = channel.unary_unary(MODEL_INFER)  # bytes in, bytes out: no (de)serializing here
            await channel.channel_ready()
            start = time.perf_counter()
            warm_until, stop_at = start + warmup, start + warmup + duration
            if stream:
                await _stream_load(channel, requests_per_call, warm_until, stop_at, latencies, counts)
                return latencies, counts[0], counts[1]

            async def lane(requests: list[bytes]) -> None:
                i = 0
                while True:
                    now = time.perf_counter()
                    if now >= stop_at:
                        return
                    try:
                        await call(requests[i % len(requests)])
                    except grpc.aio.AioRpcError:
                        counts[1] += 1
                    i += 1
                    done = time.perf_counter()
                    counts[0] += 1
                    if done > warm_until:
                        latencies.append(done - now)

            await asyncio.gather(*(lane(requests) for requests in requests_per_call))
        return latencies, counts[0], counts[1]

    try:
        queue.put(asyncio.run(main()))
    except BaseException as exc:
        queue.put(exc)
        raise


async def _stream_load(channel, requests_per_call: list[list[bytes]], warm_until: float, stop_at: float,
                       latencies: list[float], counts: list[int]) -> None:
    """One ModelStreamInfer stream with ``len(requests_per_call)`` requests in flight: each
    answer lets the next request go (answers carry the request id, matched here)."""
    from tritonclient.grpc import service_pb2

    call = channel.stream_stream(MODEL_STREAM_INFER)()
    pool = [request for requests in requests_per_call for request in requests]
    sent: dict[str, float] = {}
    serial = 0

    async def send() -> None:
        nonlocal serial
        message = service_pb2.ModelInferRequest.FromString(pool[serial % len(pool)])
        message.id = str(serial)
        sent[message.id] = time.perf_counter()
        serial += 1
        await call.write(message.SerializeToString())

    for _ in requests_per_call:
        await send()
    while True:
        answer = service_pb2.ModelStreamInferResponse.FromString(await call.read())
        done = time.perf_counter()
        counts[0] += 1
        if answer.error_message:
            counts[1] += 1
        began = sent.pop(answer.infer_response.id)
        if done > warm_until:
            latencies.append(done - began)
        if done < stop_at:
            await send()
        elif not sent:
            break
    await call.done_writing()


def run_grpc_load(address: str, requests_per_call: list[list[bytes]], duration: float, warmup: float,
                  server_pid: int, stream: bool = False) -> dict:
    context = mp.get_context("spawn")
    queue = context.Queue()
    proc = context.Process(target=_grpc_load,
                           args=(address, requests_per_call, duration, warmup, queue, bench.LOAD_CPUS, stream))
    cpu_before = bench.cpu_seconds(server_pid)
    proc.start()
    result = queue.get()
    proc.join()
    if isinstance(result, BaseException):
        raise RuntimeError("gRPC load generator failed") from result
    latencies, total, failed = result
    latencies.sort()
    n = len(latencies)
    return {"requests": n, "req_s": n / duration, "errors": failed,
            "p50_ms": 1e3 * latencies[n // 2] if n else float("nan"),
            "p99_ms": 1e3 * latencies[min(n - 1, int(n * 0.99))] if n else float("nan"),
            "cpu_us": 1e6 * (bench.cpu_seconds(server_pid) - cpu_before) / total if total else float("nan")}


def main() -> None:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.timing_options(parser, duration=4.0, rounds=3)
    args = parser.parse_args()
    if (os.cpu_count() or 1) >= 2:
        bench.SERVER_CPUS, bench.LOAD_CPUS = {0}, {1}
    rng = np.random.default_rng(0)
    bench.machine_state("start")
    print(f"pinned: {'server on CPU 0, load generator on CPU 1' if bench.SERVER_CPUS else 'no'}; "
          f"{args.duration:g} s per point after {args.warmup:g} s warm-up; {args.rounds} interleaved rounds",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        bench.build_bundles(repo)
        grpc_port = bench.free_port()
        proc, port = bench.start_rlserve(repo, {"RLSERVE_GRPC_PORT": str(grpc_port)})
        kinds = [("JSON", lambda c: bench.run_load(port, bench.mlp_batch64(c, rng), args.duration, args.warmup,
                                                   proc.pid)),
                 ("OIP binary", lambda c: bench.run_load(port, bench.infer_binary64(c, rng), args.duration,
                                                         args.warmup, proc.pid)),
                 ("gRPC", lambda c: run_grpc_load(f"127.0.0.1:{grpc_port}", grpc_requests(c, rng), args.duration,
                                                  args.warmup, proc.pid)),
                 ("gRPC stream", lambda c: run_grpc_load(f"127.0.0.1:{grpc_port}", grpc_requests(c, rng),
                                                         args.duration, args.warmup, proc.pid, stream=True))]
        results: dict[tuple[str, int], list[dict]] = {}
        try:
            for r in range(args.rounds):
                order = kinds if r % 2 == 0 else kinds[::-1]
                for c in args.concurrency:
                    for name, measure in order:
                        res = measure(c)
                        results.setdefault((name, c), []).append(res)
                        print(f"round {r + 1} {name:11s} c={c:<3d} {64 * res['req_s']:9.0f} obs/s "
                              f"({res['req_s']:7.0f} req/s, p50 {res['p50_ms']:6.2f} ms, p99 {res['p99_ms']:6.2f} ms, "
                              f"server {res['cpu_us']:6.0f} us CPU/request, {res['errors']} errors)", flush=True)
        finally:
            bench.stop(proc)
    print("\nmedians (64 observations per request):")
    for c in args.concurrency:
        cells = []
        for name, _ in kinds:
            runs = results[(name, c)]
            cells.append(f"{name} {statistics.median(64 * x['req_s'] for x in runs):8.0f} obs/s "
                         f"({statistics.median(x['cpu_us'] for x in runs):5.0f} us CPU/req)")
        print(f"c={c:<3d} " + " | ".join(cells))
    bench.machine_state("end")


if __name__ == "__main__":
    main()
