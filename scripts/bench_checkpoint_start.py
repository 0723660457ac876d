"""How long `rlserve serve --checkpoint NAME=DIR` takes to be ready, first and second time.

The first start exports the checkpoint (torch, the ONNX exporter, the verification) and
keeps the bundle in the export cache (RLSERVE_EXPORT_CACHE, a fresh temporary folder per
round here); the second start of the same checkpoint loads the kept bundle without
importing torch. Each start is timed from the process's launch to its first 200 on
/readyz, and the server's log says whether it exported. A plain start (the embedded
default models, no checkpoint) is timed too: the floor both are measured against.

    python scripts/bench_checkpoint_start.py [--checkpoint DIR] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "checkpoints" / "ppo_cartpole_msgpack" / "checkpoint"
EXPORTING = "exporting the RLlib checkpoint"
LABELS = {"plain": "plain start", "first": "first start (exports)", "second": "second start (kept export)"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rlserve() -> list[str]:
    script = shutil.which("rlserve", path=str(Path(sys.executable).parent)) or shutil.which("rlserve")
    return [script] if script else [sys.executable, "-m", "rlserve.service.cli"]


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) the process has used so far (Linux; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_start(args: list[str], cache: Path, timeout_s: float = 600.0) -> tuple[float, float, str]:
    """Seconds from launch to ready (wall clock, and the server's CPU time: the work it did,
    whatever else the machine was busy with), and what the server logged."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSERVE_")}
    env.update(RLSERVE_PORT=str(port), RLSERVE_EXPORT_CACHE=str(cache), RLSERVE_LOG_LEVEL="info")
    with tempfile.TemporaryFile() as log:
        started = time.perf_counter()
        proc = subprocess.Popen([*_rlserve(), "serve", *args], env=env, stdout=subprocess.DEVNULL, stderr=log)
        try:
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"rlserve serve exited with {proc.returncode}:\n{log.read().decode()[-2000:]}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
                        if answer.status == 200:
                            break
                except (urllib.error.URLError, OSError):
                    pass
                if time.perf_counter() - started > timeout_s:
                    raise TimeoutError(f"not ready after {timeout_s} s")
                time.sleep(0.05)  # polling interval
            ready = time.perf_counter() - started
            cpu = cpu_seconds(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        log.seek(0)
        return ready, cpu, log.read().decode(errors="replace")


def machine() -> str:
    cpu = "?"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return (f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}  cpu: {cpu}  nproc={os.cpu_count()}  "
            f"load average (1/5/15 min): {load}  python {platform.python_version()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=FIXTURE, help="RLlib checkpoint directory")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of (plain, first, second); medians are shown")
    args = parser.parse_args()
    print(f"machine: {machine()}", flush=True)
    serve = ["--checkpoint", f"bench={args.checkpoint}"]
    runs: dict[str, list[tuple[float, float]]] = {"plain": [], "first": [], "second": []}
    for round_ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="rlserve-export-cache-") as folder:
            cache = Path(folder)
            runs["plain"].append(timed_start([], cache)[:2])
            *first, log = timed_start(serve, cache)
            assert EXPORTING in log, "the first start did not export (is the cache folder fresh?)"
            runs["first"].append((first[0], first[1]))
            *second, log = timed_start(serve, cache)
            assert EXPORTING not in log, f"the second start exported again:\n{log[-2000:]}"
            runs["second"].append((second[0], second[1]))
        print(f"round {round_ + 1}: " + ", ".join(f"{LABELS[k]} {v[-1][0]:.2f} s (cpu {v[-1][1]:.2f} s)"
                                                 for k, v in runs.items()), flush=True)
    wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
    print(f"median of {args.rounds}: " + ", ".join(f"{LABELS[k]} {wall[k]:.2f} s (cpu {cpu[k]:.2f} s)" for k in runs))
    print(f"second start speed-up: {wall['first'] / wall['second']:.1f}x wall clock, "
          f"{cpu['first'] / cpu['second']:.1f}x cpu time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
