"""Soak: minutes of steady mixed load with hostile requests mixed in (not a test: it prints numbers).

Issue 29 asks whether the server holds up over time, not only at a peak: memory that creeps,
a tail latency that grows, errors that appear after a while. This script starts ``rlserve
serve`` on the embedded models (the CartPole MLP and the LSTM) and:

1. measures the peak briefly: closed-loop load of the mix below for ``--peak-seconds``
   (or takes ``--rate`` requests/s as given);
2. runs ``--minutes`` at ``--load`` (default 0.8) of that peak, open-loop (requests are
   scheduled at the rate whatever the answers do, and each latency counts from the
   request's scheduled time, so a stall is not hidden), over ``--connections`` keep-alive
   connections; the mix: single observations (JSON), LSTM sessions (JSON, each connection
   stepping its own sessions, a new episode every 200 steps), 64-row binary blocks (raw
   ``application/octet-stream``) and Open Inference Protocol requests (64 rows, binary
   tensor data);
3. sends ``--hostile`` hostile requests per second besides, each on a fresh connection:
   declared sizes the body does not hold (zero-width, overflowing, huge; raw, base64 block,
   v2 JSON and binary), a 1 MiB session id, a 1 MiB unknown key. Each must get a 4xx.

Every ``--window`` seconds (default 60: "per minute") it prints the requests, errors, p50
and p99 of the mix, the hostile requests and how many got a 4xx, and the server's resident
memory (``VmRSS``, and the peak ``VmHWM``). At the end it checks the targets of issue 29
and exits 1 if one is missed (``--no-check``: report only):

- 0 errors (a mix request answered other than 200, a hostile one other than 4xx);
- RSS after the first window within 5% of the RSS at its end;
- p99 of the last window within 1.5x of the first window's.

    python scripts/soak.py                      # 10 minutes at 80% of the measured peak
    python scripts/soak.py --minutes 2 --rate 2000
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_server as bench  # noqa: E402  (the sibling script: server start, machine line)

SESSION_STEPS = 200  # a session starts a new episode this often
SESSIONS_PER_CONNECTION = 4
LONG = "s" * (1 << 20)


# --------------------------------------------------------------------------- requests

def _request(method: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}Content-Length: {len(body)}\r\n\r\n"
            .encode() + body)


def _json(path: str, payload: object) -> bytes:
    return _request("POST", path, json.dumps(payload).encode(), {"Content-Type": "application/json"})


def _raw(path: str, body: bytes, shape: str) -> bytes:
    return _request("POST", path, body, {"Content-Type": "application/octet-stream",
                                         "X-Rlserve-Dtype": "float32", "X-Rlserve-Shape": shape})


def _v2(path: str, inputs: list[dict], data: bytes) -> bytes:
    header = json.dumps({"inputs": inputs}).encode()
    return _request("POST", path, header + data, {"Content-Type": "application/octet-stream",
                                                  "Inference-Header-Content-Length": str(len(header))})


MLP, LSTM = "/v1/models/cartpole/act", "/v1/models/cartpole-memory/act"
INFER = "/v2/models/cartpole/infer"


class Mix:
    """The mix's requests, pre-encoded; sessions are stepped per connection."""

    def __init__(self, rng: np.random.Generator):
        rows = rng.uniform(-0.2, 0.2, (64, 4)).astype(np.float32)
        self.single = [_json(MLP, {"observation": row.tolist()}) for row in rows[:16]]
        self.binary = _raw(MLP, rows.tobytes(), "64,4")
        self.infer = _v2(INFER, [{"name": "obs", "shape": [64, 4], "datatype": "FP32",
                                  "parameters": {"binary_data_size": rows.nbytes}}], rows.tobytes())
        self.lstm_obs = rng.uniform(-0.2, 0.2, (16, 2)).astype(np.float32).tolist()
        self.kinds = ["single"] * 8 + ["session"] * 6 + ["binary"] * 3 + ["infer"] * 3

    def session_step(self, session: str, step: int) -> bytes:
        body: dict[str, object] = {"observation": self.lstm_obs[step % 16], "session_id": session}
        if step % SESSION_STEPS == 0:
            body["episode_start"] = True
        return _json(LSTM, body)


def hostile_requests() -> list[tuple[str, bytes]]:
    """(what, request): declared sizes the body does not hold, and long strings."""
    empty = base64.b64encode(b"").decode()
    overflowing = [1170185322465, 0, 50, 811, 55, 53288349742, 3]
    return [
        ("raw zero-width", _raw(MLP, b"", "20000000,0")),
        ("raw overflowing", _raw(MLP, b"", ",".join(map(str, overflowing)))),
        ("block huge zero-width", _json(MLP, {"observations": {"b64": empty, "dtype": "float32",
                                                               "shape": [4294967296, 0]}})),
        ("v2 JSON overflowing", _json(INFER, {"inputs": [{"name": "obs", "shape": overflowing, "datatype": "FP32",
                                                          "data": []}]})),
        ("v2 binary claims 1 TiB", _v2(INFER, [{"name": "obs", "shape": [1 << 38, 1], "datatype": "FP32",
                                                "parameters": {"binary_data_size": 1 << 40}}], b"")),
        ("1 MiB session id", _json(LSTM, {"observation": [0.0, 0.0], "session_id": LONG})),
        ("1 MiB unknown key", _json(MLP, {"observation": [0.0] * 4, LONG: 1})),
    ]


# --------------------------------------------------------------------------- load

async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> int:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    await reader.readexactly(length)
    return int(head[9:12])


@dataclass
class Window:
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    hostile: int = 0
    hostile_4xx: int = 0

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


class Soak:
    def __init__(self, port: int, mix: Mix, connections: int):
        self.port, self.mix, self.connections = port, mix, connections
        self.window = Window()
        self.rng = random.Random(0)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)

    def _next(self, conn: int, steps: list[int]) -> bytes:
        kind = self.rng.choice(self.mix.kinds)
        if kind == "session":
            which = self.rng.randrange(SESSIONS_PER_CONNECTION)
            steps[which] += 1
            return self.mix.session_step(f"soak-{conn}-{which}", steps[which] - 1)
        if kind == "single":
            return self.rng.choice(self.mix.single)
        return self.mix.binary if kind == "binary" else self.mix.infer

    async def _worker(self, conn: int, slots: asyncio.Queue | None, stop_at: float) -> int:
        """One connection: takes scheduled slots (open loop), or sends back to back
        (``slots`` None: the closed loop of the peak measurement). Returns requests sent."""
        reader, writer = await self._connect()
        steps = [0] * SESSIONS_PER_CONNECTION
        sent = 0
        try:
            while True:
                if slots is None:
                    if time.perf_counter() >= stop_at:
                        return sent
                    scheduled = time.perf_counter()
                else:
                    scheduled = await slots.get()
                    if scheduled is None:
                        return sent
                request = self._next(conn, steps)
                try:
                    status = await _exchange(reader, writer, request)
                except (OSError, asyncio.IncompleteReadError) as exc:
                    self.window.error(type(exc).__name__)
                    writer.close()
                    reader, writer = await self._connect()
                    continue
                sent += 1
                self.window.latencies.append(time.perf_counter() - scheduled)
                if status != 200:
                    self.window.error(f"HTTP {status}")
        finally:
            writer.close()

    async def closed_loop(self, seconds: float) -> float:
        """Requests/s of the mix with every connection sending back to back."""
        stop_at = time.perf_counter() + seconds
        counts = await asyncio.gather(*(self._worker(c, None, stop_at) for c in range(self.connections)))
        return sum(counts) / seconds

    async def open_loop(self, rate: float, seconds: float, hostile_rate: float, window_s: float,
                        report) -> None:
        slots: asyncio.Queue = asyncio.Queue()
        workers = [asyncio.create_task(self._worker(c, slots, 0.0)) for c in range(self.connections)]
        hostile = asyncio.create_task(self._hostile(hostile_rate, seconds))
        start = time.perf_counter()
        next_window, sent = start + window_s, 0
        while (now := time.perf_counter()) < start + seconds:
            due = int((now - start) * rate) - sent  # slots owed by now: a late wake-up catches up
            for _ in range(due):
                slots.put_nowait(start + (sent := sent + 1) / rate)
            if now >= next_window:
                report(self.window)
                self.window = Window()
                next_window += window_s
            await asyncio.sleep(0.001)
        for _ in workers:
            slots.put_nowait(None)
        await asyncio.gather(*workers, hostile)
        report(self.window)

    async def _hostile(self, rate: float, seconds: float) -> None:
        if rate <= 0:
            return
        requests = hostile_requests()
        stop_at, i = time.perf_counter() + seconds, 0
        while time.perf_counter() < stop_at:
            what, request = requests[i % len(requests)]
            i += 1
            try:
                reader, writer = await self._connect()
                try:
                    status = await _exchange(reader, writer, request)
                finally:
                    writer.close()
            except (OSError, asyncio.IncompleteReadError) as exc:
                status, what = 0, f"{what}: {type(exc).__name__}"
            self.window.hostile += 1
            if 400 <= status < 500:
                self.window.hostile_4xx += 1
            else:
                self.window.error(f"hostile {what} answered {status}")
            await asyncio.sleep(1.0 / rate)


# --------------------------------------------------------------------------- report

def rss(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            values[line[:5]] = int(line.split()[1]) / 1024
    return values["VmRSS"], values["VmHWM"]


@dataclass
class Row:
    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    rss_mib: float


def _percentile(values: list[float], q: float) -> float:
    return 1e3 * float(np.percentile(values, q)) if values else float("nan")


def check(rows: list[Row], errors: int) -> list[tuple[str, bool, str]]:
    """The targets of issue 29: (target, met, the numbers)."""
    first, last = rows[0], rows[-1]
    later = [r.rss_mib for r in rows[1:]] or [first.rss_mib]
    drift = max(abs(r - first.rss_mib) for r in later) / first.rss_mib
    ratio = last.p99_ms / first.p99_ms
    return [("0 errors", errors == 0, f"{errors} errors"),
            ("RSS after the first window within 5%", drift <= 0.05,
             f"{first.rss_mib:.1f} MiB after the first window, then {min(later):.1f}..{max(later):.1f} MiB "
             f"({100 * drift:.1f}%)"),
            ("p99 of the last window within 1.5x of the first", ratio <= 1.5,
             f"{first.p99_ms:.2f} ms first, {last.p99_ms:.2f} ms last ({ratio:.2f}x)")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--window", type=float, default=60.0, help="seconds per reported window")
    parser.add_argument("--rate", type=float, help="requests/s of the mix (default: --load of the measured peak)")
    parser.add_argument("--load", type=float, default=0.8)
    parser.add_argument("--peak-seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--hostile", type=float, default=5.0, help="hostile requests per second")
    parser.add_argument("--no-check", action="store_true", help="report only; exit 0 whatever the targets")
    args = parser.parse_args()
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    bench.machine_state("soak start")
    proc, port = bench.start_rlserve(bench.ROOT / "service" / "default_models", {})
    try:
        soak = Soak(port, Mix(np.random.default_rng(0)), args.connections)
        rate = args.rate
        if rate is None:
            peak = asyncio.run(soak.closed_loop(args.peak_seconds))
            rate = args.load * peak
            print(f"peak {peak:.0f} req/s over {args.peak_seconds:.0f} s (closed loop, c={args.connections}); "
                  f"soaking at {rate:.0f} req/s ({100 * args.load:.0f}%)", flush=True)
        soak.window = Window()
        rows: list[Row] = []
        errors: dict[str, int] = {}

        def report(window: Window) -> None:
            resident, peak_rss = rss(proc.pid)
            row = Row(len(window.latencies), sum(window.errors.values()), _percentile(window.latencies, 50),
                      _percentile(window.latencies, 99), resident)
            rows.append(row)
            for what, n in window.errors.items():
                errors[what] = errors.get(what, 0) + n
            print(f"window {len(rows):>3}: {row.requests:>7} requests ({row.requests / args.window:7.0f}/s)  "
                  f"errors {row.errors}  p50 {row.p50_ms:6.2f} ms  p99 {row.p99_ms:7.2f} ms  "
                  f"hostile {window.hostile} ({window.hostile_4xx} 4xx)  RSS {resident:.1f} MiB "
                  f"(peak {peak_rss:.1f})" + (f"  {window.errors}" if window.errors else ""), flush=True)

        asyncio.run(soak.open_loop(rate, 60 * args.minutes, args.hostile, args.window, report))
    finally:
        bench.stop(proc)
    rows = [r for r in rows if r.requests] or rows
    results = check(rows, sum(errors.values()))
    for target, met, numbers in results:
        print(f"{'PASS' if met else 'FAIL'}  {target}: {numbers}")
    if errors:
        print(f"errors: {errors}")
    bench.machine_state("soak end")
    return 0 if args.no_check or all(met for _, met, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
