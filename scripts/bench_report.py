"""What bench_server.py prints and writes besides its table rows: the machine's state at
the start and end of a run, the results file (``--json``), the before/after table of a
``--baseline`` run and the targets as ratios of this run's numbers. Imported by
bench_server.py, which re-exports these names.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from bench_scenarios import SCENARIOS

ROOT = Path(__file__).resolve().parents[1]
BINARY_TARGET = 250_000  # obs/s for 64-observation binary requests at c=16


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("?" where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def machine_line() -> str:
    """The first line of a side-by-side benchmark: the machine it ran on, which its ratios
    need (speeds are compared within the run only)."""
    return (f"machine: {platform.machine()} {cpu_model()} cpus={os.cpu_count()} python={platform.python_version()} "
            f"(shared with other work: compare within this run)")


def machine_state(label: str) -> None:
    """What a reader needs to judge the numbers: when, on what, how busy, which code."""
    cpu = cpu_model()
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = "?"
    print(f"[{label}] {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  cpu: {cpu}  nproc={os.cpu_count()}  "
          f"load average (1/5/15 min): {load}  commit {commit}  python {platform.python_version()}", flush=True)


def write_results(path: Path, rows: list[tuple[str, int, dict, int]], args: argparse.Namespace) -> None:
    """The table's numbers as a results file (one run), for the plot and docs/benchmarks.md's table."""
    from bench_results import run_record

    labels = {key: label for key, label, *_ in SCENARIOS}
    commit = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                            text=True).stdout.strip() or "?"
    setup = (f"{'servers on CPU 0, load generator on CPU 1' if args.pin else 'not pinned'}; "
             f"server settings: {' '.join(args.env) or 'defaults'}; nproc={os.cpu_count()}")
    record = run_record("run", " ".join(["python", *sys.argv]), time.strftime("%Y-%m-%d %H:%M %Z"), commit, setup,
                        [(key, labels[key], c, res, obs) for key, c, res, obs in rows])
    path.write_text(json.dumps({"runs": [record]}, indent=1) + "\n")
    print(f"results written to {path}", flush=True)


def compare(before: list[tuple[str, int, dict, int]], after: list[tuple[str, int, dict, int]]) -> None:
    """The before/after table of this run (markdown, for docs/benchmarks.md)."""
    old = {(key, c): res for key, c, res, _ in before}
    labels = {key: label for key, label, *_ in SCENARIOS}
    print("\nbefore/after (same run, alternating):\n")
    print("| scenario | c | req/s before | req/s after | after/before | p50 ms before | p50 ms after "
          "| server CPU us/req before | after |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key, c, res, obs in after:
        if (key, c) not in old:
            continue
        b = old[(key, c)]
        unit = f" ({obs} obs each)" if obs > 1 else ""
        if b["errors"] or res["errors"]:  # e.g. a request form the baseline does not know
            print(f"| {labels[key]}{unit} | {c} | errors: {b['errors']} before, {res['errors']} after "
                  f"| | | | | | |", flush=True)
            continue
        print(f"| {labels[key]}{unit} | {c} | {b['req_s']:,.0f} | {res['req_s']:,.0f} | "
              f"{res['req_s'] / b['req_s']:.2f} | {b['p50_ms']:.2f} | {res['p50_ms']:.2f} | "
              f"{b['cpu_us']:.1f} | {res['cpu_us']:.1f} |", flush=True)


def summarize(rows: list[tuple[str, int, dict, int]]) -> None:
    """The issue's targets, as ratios of numbers measured in this run."""
    got = {(key, c): res for key, c, res, _ in rows}

    def ratio(a: tuple[str, int], b: tuple[str, int]) -> str:
        """req/s ratio, and in brackets the inverse ratio of server CPU per request."""
        if a in got and b in got and got[b]["req_s"]:
            return f"{got[a]['req_s'] / got[b]['req_s']:.2f} [cpu {got[b]['cpu_us'] / got[a]['cpu_us']:.2f}]"
        return "n/a"

    print("\ntargets (this run):")
    for c in sorted({c for _, c in got}):
        print(f"  c={c:<3} MLP / minimal ASGI {ratio(('mlp', c), ('minimal', c))} (>= {0.5 if c == 1 else 0.8})   "
              f"LSTM sessions / MLP stateless {ratio(('lstm', c), ('mlp', c))}   "
              f"LSTM sessions / LSTM stateless {ratio(('lstm', c), ('lstm_stateless', c))} (>= 0.8)")
    for c in sorted({c for _, c in got}):
        json64, raw64, infer64 = got.get(("batch64", c)), got.get(("binary64", c)), got.get(("infer64", c))
        if json64 is not None or raw64 is not None or infer64 is not None:
            def obs_s(res: dict | None) -> str:
                return "n/a" if res is None else f"{res['req_s'] * 64:>9.0f}"
            print(f"  64-obs requests c={c:<3} JSON {obs_s(json64)} obs/s   raw binary {obs_s(raw64)} obs/s   "
                  f"OIP binary {obs_s(infer64)} obs/s (binary >= {BINARY_TARGET})")
    worst = max(((res["p99_ms"] / res["p50_ms"], key, c) for (key, c), res in got.items()
                 if key != "minimal" and res["p50_ms"] > 0), default=None)
    if worst:
        print(f"  worst p99/p50: {worst[0]:.2f} ({worst[1]} c={worst[2]}) (<= 3)")
