"""Plot benchmark results (a ``bench_server.py --json`` file) and print their Markdown table.

    python scripts/plot_benchmarks.py [RESULTS.json] [--out PLOT.png] [--table]

Defaults: docs/benchmarks.json to docs/benchmarks.png, the picture docs/benchmarks.md opens
with. Left: requests per second of the single-observation scenarios beside the minimal
ASGI app, per concurrency, from the first run that has the minimal app. Right, when a run
has them: observations per second of the 64-observation scenarios. ``--table`` prints the
table docs/benchmarks.md shows (a test checks that the page holds exactly this table).
Needs matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_results import CONCURRENCIES, load, obs_per_s, table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _single_obs_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    for run in runs:
        if any(r["scenario"] == "minimal" for r in run["results"]):
            return run
    raise SystemExit("no run with the minimal app to compare with")


def plot(runs: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    single = _single_obs_run(runs)
    multi = [(run, r) for run in runs for r in run["results"] if r["obs_per_request"] > 1]
    fig, axes = plt.subplots(1, 2 if multi else 1, figsize=(12 if multi else 7, 4.2), squeeze=False)
    _bars_single(axes[0][0], single)
    if multi:
        _bars_multi(axes[0][1], multi)
    fig.suptitle("rlserve against a minimal ASGI app on the same uvicorn (2 vCPUs; higher is better)", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110, metadata={"Software": None})
    plt.close(fig)


def _bars_single(ax: Any, run: dict[str, Any]) -> None:
    rows = [r for r in run["results"] if r["obs_per_request"] == 1 and "req_s" in r]
    labels = list(dict.fromkeys(r["label"] for r in rows))
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        values = [next((r["req_s"] for r in rows if r["label"] == label and r["c"] == c), 0) for c in CONCURRENCIES]
        positions = [j + (i - (len(labels) - 1) / 2) * width for j in range(len(CONCURRENCIES))]
        ax.bar(positions, values, width, label=label, color="0.6" if "minimal" in label else None)
    ax.set_xticks(range(len(CONCURRENCIES)), [f"c = {c}" for c in CONCURRENCIES])
    ax.set_ylim(0, 1.4 * max(r["req_s"] for r in rows))  # room for the legend above the bars
    ax.set_ylabel("requests/s (1 observation each)")
    ax.set_title(f"{run['title']} ({run['commit']})", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", ncols=2)


def _bars_multi(ax: Any, points: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    names = [f"{r['label']}\nc = {r['c']}" for _, r in points]
    ax.barh(range(len(points)), [obs_per_s(r) or 0 for _, r in points], color="tab:green")
    ax.set_yticks(range(len(points)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("observations/s (64 per request)")
    ax.set_title("; ".join(sorted({f"{run['title']} ({run['commit']})" for run, _ in points})), fontsize=9)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="?", type=Path, default=ROOT / "docs" / "benchmarks.json")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.png")
    parser.add_argument("--table", action="store_true", help="print the Markdown table too")
    args = parser.parse_args()
    runs = load(args.results)
    plot(runs, args.out)
    print(f"wrote {args.out}")
    if args.table:
        print(table(runs), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
