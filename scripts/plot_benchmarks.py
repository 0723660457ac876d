"""Plot benchmark results (a ``bench_server.py --json`` file) and print their Markdown table.

    python scripts/plot_benchmarks.py [RESULTS.json] [--out PLOT.png] [--table]
    python scripts/plot_benchmarks.py --peers docs/bench-peers.json --out docs/bench-peers.png [--table]

Defaults: docs/benchmarks.json to docs/benchmarks.png, the picture docs/benchmarks.md opens
with. Left: requests per second of the single-observation scenarios beside the minimal
ASGI app, per concurrency, from the first run that has the minimal app. Right, when a run
has them: observations per second of the 64-observation scenarios. ``--table`` prints the
table docs/benchmarks.md shows (a test checks that the page holds exactly this table).
With ``--peers``, the file is a ``bench_peers.py --json`` file instead: one figure, a panel
per scenario, rlserve beside the other servers at each concurrency (``--table`` prints the
tables docs/benchmarks.md opens with). Needs matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_peers_results import SCENARIOS, load_peers, results_table, systems_table  # noqa: E402
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


def plot_peers(data: dict[str, Any], out: Path) -> None:
    """bench_peers.py's results: a panel per scenario, a bar per server and concurrency
    (requests/s; observations/s for multi-observation requests), rlserve first; the minimal
    app (no model) only in the table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # The minimal app runs no model: its bars would set the scale; the table has its figures.
    ran = [s for s in data["systems"] if s["status"] == "ran" and s["key"] != "minimal"]
    got = {(r["system"], r["scenario"], r["c"]): r for r in data["results"]}
    scenarios = [key for key in SCENARIOS if any(r["scenario"] == key for r in data["results"])]
    fig, axes = plt.subplots(1, len(scenarios), figsize=(5 * len(scenarios), 4.4), squeeze=False)
    colors = plt.get_cmap("tab10")
    for ax, scenario in zip(axes[0], scenarios, strict=True):
        label, obs, _ = SCENARIOS[scenario]
        systems = [s for s in ran if any((s["key"], scenario, c) in got for c in CONCURRENCIES)]
        width = 0.8 / len(systems)
        for i, system in enumerate(systems):
            values = [got[(system["key"], scenario, c)]["req_s"] * obs if (system["key"], scenario, c) in got else 0
                      for c in CONCURRENCIES]
            positions = [j + (i - (len(systems) - 1) / 2) * width for j in range(len(CONCURRENCIES))]
            ax.bar(positions, values, width, label=system["label"], color=colors(i),
                   edgecolor="black" if system["key"] == "rlserve" else None)
        ax.set_xticks(range(len(CONCURRENCIES)), [f"c = {c}" for c in CONCURRENCIES])
        ax.set_ylabel("observations/s" if obs > 1 else "requests/s")
        ax.set_title(label, fontsize=10)
        ax.legend(fontsize=7, loc="upper left")
    machine = data["machine"]
    fig.suptitle(f"rlserve beside other serving systems, the same networks and weights ({machine['nproc']} CPUs, "
                 f"shared; {data['when']}; higher is better)", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=100, metadata={"Software": None})
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="?", type=Path, default=ROOT / "docs" / "benchmarks.json")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.png")
    parser.add_argument("--table", action="store_true", help="print the Markdown table too")
    parser.add_argument("--peers", type=Path, default=None, metavar="PEERS_RESULTS",
                        help="plot a bench_peers.py results file instead (docs/bench-peers.json)")
    args = parser.parse_args()
    if args.peers is not None:
        data = load_peers(args.peers)
        plot_peers(data, args.out)
        print(f"wrote {args.out}")
        if args.table:
            print(results_table(data) + "\n" + systems_table(data), end="")
        return 0
    runs = load(args.results)
    plot(runs, args.out)
    print(f"wrote {args.out}")
    if args.table:
        print(table(runs), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
