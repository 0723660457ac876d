"""The results file of scripts/bench_peers.py (docs/bench-peers.json) and its two tables.

    {"command", "when", "commit",
     "machine": {"cpu", "nproc", "python", "pinned", "loadavg_before", "loadavg_after"},
     "settings": {"duration_s", "warmup_s", "rounds", "concurrency"},
     "systems": [{"key", "label", "versions", "batching", "state", "status"}, ...],
     "results": [{"system", "scenario", "c", "obs_per_request", "req_s", "obs_s", "p50_ms",
                  "p99_ms", "cpu_us", "errors", "rounds_req_s"}, ...]}

``status`` is "ran" or why the system was not measured. Each result is the median round of
its cell (by req/s; its p50 and p99 are that round's), its CPU per request the median of
the rounds' own. ``results_table`` and ``systems_table`` are the tables bench_peers.py
prints and docs/benchmarks.md opens with (a test checks the page holds exactly them).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

CONCURRENCIES = (1, 16, 64)
# key: (label, observations per request, model served)
SCENARIOS = {
    "mlp1": ("MLP 256x256, 1 obs/request", 1, "mlp"),
    "mlp64": ("MLP 256x256, 64 obs/request", 64, "mlp"),
    "lstm": ("LSTM 256, state per client, 1 obs/request", 1, "lstm"),
}


def load_peers(path: Path) -> dict[str, Any]:
    data = json.loads(Path(path).read_text())
    for key in ("command", "when", "commit", "machine", "settings", "systems", "results"):
        if key not in data:
            raise ValueError(f"{path}: no {key!r}")
    return data


def cell_result(system: str, scenario: str, c: int, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One cell of the results file from its rounds (``bench_server.run_load``'s dicts)."""
    obs = SCENARIOS[scenario][1]
    middle = sorted(rounds, key=lambda r: r["req_s"])[len(rounds) // 2]
    return {"system": system, "scenario": scenario, "c": c, "obs_per_request": obs,
            "req_s": round(middle["req_s"], 1), "obs_s": round(middle["req_s"] * obs),
            "p50_ms": round(middle["p50_ms"], 2), "p99_ms": round(middle["p99_ms"], 2),
            "cpu_us": round(statistics.median(r["cpu_us"] for r in rounds), 1),
            "errors": sum(r["errors"] for r in rounds),
            "rounds_req_s": [round(r["req_s"], 1) for r in rounds]}


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _cell(result: dict[str, Any] | None) -> str:
    if result is None:
        return "-"
    rate = f"{_number(result['req_s'])} req/s"
    if result["obs_per_request"] > 1:
        rate += f" ({_number(result['obs_s'])} obs/s)"
    text = (f"{rate}; p50 {result['p50_ms']:.2f} / p99 {result['p99_ms']:.2f} ms; "
            f"{_number(result['cpu_us'])} µs CPU")
    if result["errors"]:
        text += f"; **{result['errors']} errors**"
    return text


def results_table(data: dict[str, Any]) -> str:
    """One row per scenario and system that ran, one column per concurrency; each cell:
    requests/s (and observations/s), p50 / p99 latency, server CPU per request."""
    labels = {s["key"]: s["label"] for s in data["systems"]}
    ran = [s["key"] for s in data["systems"] if s["status"] == "ran"]
    got = {(r["system"], r["scenario"], r["c"]): r for r in data["results"]}
    lines = ["| scenario | server | " + " | ".join(f"c = {c}" for c in CONCURRENCIES) + " |",
             "|---|---|" + "---|" * len(CONCURRENCIES)]
    for scenario, (label, _, _) in SCENARIOS.items():
        for system in ran:
            if not any((system, scenario, c) in got for c in CONCURRENCIES):
                continue
            cells = [_cell(got.get((system, scenario, c))) for c in CONCURRENCIES]
            lines.append(f"| {label} | {labels[system]} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def systems_table(data: dict[str, Any]) -> str:
    """What each system is: versions, how it batches, what it does with the LSTM's state,
    and whether it ran (or why not)."""
    lines = ["| server | versions | batching | LSTM state per client | measured |", "|---|---|---|---|---|"]
    for s in data["systems"]:
        versions = ", ".join(f"{name} {version}" for name, version in s["versions"].items()) or "-"
        lines.append(f"| {s['label']} | {versions} | {s['batching']} | {s['state']} | {s['status']} |")
    return "\n".join(lines) + "\n"
