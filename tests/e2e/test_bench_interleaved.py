"""scripts/bench_interleaved.py: two servers loaded in turns, each side's figures its own.

Two real uvicorn servers, one of which burns about 2 ms of CPU per request: the helper
must give each side its own requests, slices and CPU (a side swapped or mixed up shows the
slow server fast, or its CPU on the other side), and take its turns in the order
A B B A. Timing is only compared between sides that differ by an order of magnitude.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from bench_interleaved import block_ratios, interleaved, order  # noqa: E402
from bench_server import start_minimal, stop  # noqa: E402

pytestmark = [pytest.mark.e2e]

APP = '''
import os, time

BURN = float(os.environ["BURN_S"])


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    start = time.thread_time()
    while time.thread_time() - start < BURN:
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})
'''


def test_turns_go_a_b_b_a() -> None:
    assert order(3) == [0, 1, 1, 0, 0, 1]
    assert order(4).count(0) == order(4).count(1) == 4


def test_each_side_gets_its_own_requests_and_cpu(tmp_path: Path) -> None:
    (tmp_path / "fast").mkdir()
    (tmp_path / "slow").mkdir()
    fast = start_minimal(tmp_path / "fast", APP, {"BURN_S": "0"})
    slow = start_minimal(tmp_path / "slow", APP, {"BURN_S": "0.002"})
    try:
        request = b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}"
        got_fast, got_slow = interleaved([(fast[1], fast[0].pid), (slow[1], slow[0].pid)],
                                         [[[request]] * 2, [[request]] * 2], slices=4, slice_s=0.3, warmup_s=0.1)
    finally:
        stop(fast[0])
        stop(slow[0])
    for got in (got_fast, got_slow):
        assert got["errors"] == 0 and got["requests"] > 0 and len(got["slices"]) == 4, got
    # Two connections on a server that burns 2 ms per request: at most ~500 answers a second.
    assert got_slow["req_s"] < 600 < got_fast["req_s"], (got_fast["req_s"], got_slow["req_s"])
    assert got_slow["cpu_us"] > 1500 and got_slow["cpu_us"] > 3 * got_fast["cpu_us"], (got_fast, got_slow)
    assert all(ratio > 1.5 for ratio in block_ratios(got_fast, got_slow))
