"""The benchmark results file: ``bench_server.py --json`` writes it, the plot and the table read it.

    {"runs": [{"id", "title", "when", "commit", "command", "setup", "history",
               "results": [{"scenario", "label", "c", "obs_per_request",
                            "req_s"?, "obs_s"?, "p50_ms"?, "p99_ms"?, "cpu_us"?}, ...]}, ...]}

A run is one sitting of the benchmark; ``history`` names its section heading in
docs/benchmarks-history.md (where its full output and the machine's state are recorded).
``docs/benchmarks.json`` holds the runs docs/benchmarks.md's table and plot show; its
numbers are the ones that history records (a test checks each one is there).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

RUN_KEYS = ("id", "title", "when", "commit", "command", "setup", "history", "results")
RESULT_KEYS = ("scenario", "label", "c", "obs_per_request")
MEASURES = ("req_s", "obs_s", "p50_ms", "p99_ms", "cpu_us")
CONCURRENCIES = (1, 16, 64)


def load(path: Path) -> list[dict[str, Any]]:
    """The runs of a results file, checked for the fields the table and the plot need."""
    runs = json.loads(Path(path).read_text())["runs"]
    for run in runs:
        missing = [key for key in RUN_KEYS if key not in run]
        if missing:
            raise ValueError(f"{path}: run {run.get('id', '?')} lacks {missing}")
        for result in run["results"]:
            if any(key not in result for key in RESULT_KEYS) or not any(m in result for m in MEASURES):
                raise ValueError(f"{path}: run {run['id']}: incomplete result {result}")
    return runs


def obs_per_s(result: dict[str, Any]) -> float | None:
    if "obs_s" in result:
        return float(result["obs_s"])
    return float(result["req_s"]) * result["obs_per_request"] if "req_s" in result else None


def run_record(run_id: str, command: str, when: str, commit: str, setup: str,
               rows: list[tuple[str, str, int, dict[str, float], int]]) -> dict[str, Any]:
    """One run as the file holds it, from ``bench_server.py``'s rows (key, label, c, result, obs)."""
    results = [{"scenario": key, "label": label, "c": c, "obs_per_request": obs,
                **{m: round(res[m], 2) for m in ("req_s", "p50_ms", "p99_ms", "cpu_us") if m in res},
                **({"obs_s": round(res["req_s"] * obs)} if obs > 1 else {})}
               for key, label, c, res, obs in rows]
    return {"id": run_id, "title": f"bench_server.py, {when}", "when": when, "commit": commit,
            "command": command, "setup": setup, "history": "", "results": results}


def anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def table(runs: list[dict[str, Any]], history_page: str = "benchmarks-history.md") -> str:
    """docs/benchmarks.md's table: one row per scenario and run, the concurrencies as columns.

    Single-observation rows give req/s and, beside it, the ratio to the minimal app of the
    same run; 64-observation rows give observations per second.
    """
    lines = ["| scenario | c = 1 | c = 16 | c = 64 | server CPU µs/request (c = 1 / 16 / 64) | run |",
             "|---|---|---|---|---|---|"]
    for run in runs:
        by_key: dict[str, dict[int, dict[str, Any]]] = {}
        for result in run["results"]:
            by_key.setdefault(result["scenario"], {})[result["c"]] = result
        minimal = by_key.get("minimal", {})
        link = f"[{run['title']}]({history_page}#{anchor(run['history'])})"
        for key, points in by_key.items():
            label = next(iter(points.values()))["label"]
            cells = [_cell(points.get(c), minimal.get(c), key) for c in CONCURRENCIES]
            cpu = " / ".join(_number(points[c]["cpu_us"]) if c in points and "cpu_us" in points[c] else "-"
                             for c in CONCURRENCIES)
            lines.append(f"| {label} | {' | '.join(cells)} | {cpu} | {link} |")
    return "\n".join(lines) + "\n"


def _cell(result: dict[str, Any] | None, minimal: dict[str, Any] | None, key: str) -> str:
    if result is None:
        return "-"
    if result["obs_per_request"] > 1:
        return f"{_number(obs_per_s(result))} obs/s"
    text = f"{_number(result['req_s'])} req/s"
    if key != "minimal" and minimal is not None and "req_s" in minimal:
        text += f" ({result['req_s'] / minimal['req_s']:.2f}×)"
    return text


def _number(value: float | None) -> str:
    """As the history writes numbers: thousands with commas, small ones with their decimals."""
    if value is None:
        return "-"
    if value >= 1000 or float(value).is_integer():
        return f"{value:,.0f}"
    return f"{value:g}"
