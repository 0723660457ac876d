"""Benchmark the experience log (not a test: it prints numbers).

Single-observation MLP(256, 256) session steps at c=64 (each connection plays episodes of
100 steps: a first step that starts the episode, steps with a reward, the last
observation with ``terminated``), against two servers up side by side: the experience log
on (every episode logged, both forms written to a temporary folder) and off. Target: log
on >= 0.9x log off, in requests per second. With two or more CPUs the servers run on CPU 0
and the load generator on CPU 1, as bench_server.py pins them. After the runs it prints
what the log wrote and dropped (its Prometheus counters).

By default the two servers take turns in short slices (``--slices`` a side of ``--slice``
seconds, in the order on off off on, ...: ``bench_interleaved.py`` says why): it prints
each side's requests/s and server CPU per request over all its slices, the ratio of both,
and the spread of the requests/s ratio over blocks of four slices. It does so for
``--pairs`` fresh pairs of servers, one pair after the other, then pools them: two server
processes differ by several percent from one start to the next even in turns (where their
memory landed), so one pair alone does not settle a 10% target. The log's writer thread
runs after the answers it logs, so part of its work falls into the "off" server's next
slice on the shared core: the requests/s ratio flatters the log a little, and the CPU
ratio (off / on: the share of a saturated core's throughput the log leaves) is the one
that counts all of the log's work. ``--method rounds`` runs the earlier design instead:
``--rounds`` rounds of ``--duration`` seconds a side, alternating the order.

With ``--model lstm`` the steps are the bench LSTM 256's (one session per connection);
with ``--shadow`` the "on" server also runs a shadow candidate (the same model as version
2, ``RLSERVE_SHADOW``), whose scores of every logged step go to the log's ``shadow/`` table:
the log with the shadow's columns against no log and no shadow (the log's cost and the
shadow's model work together). With ``--shadow-both`` both servers run the shadow and only
the log differs: what writing the log, shadow columns included, costs a server that shadows.

    python scripts/bench_experience.py [--slices 40] [--slice 0.5] [--pairs 3] [--concurrency 16 64] [--model lstm]
        [--shadow | --shadow-both] [--method rounds --duration 4 --rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

import bench_server  # noqa: E402
from bench_interleaved import block_ratios, interleaved, quartiles  # noqa: E402
from bench_report import machine_line  # noqa: E402
from bench_server import _request, build_bundles, obs_row, start_rlserve, stop  # noqa: E402
from bench_sessions import load  # noqa: E402

EPISODE = 100  # steps per episode


def sessions(model: str):
    """Connections of ``model``'s session steps: one session per connection, replaying
    episodes of ``EPISODE`` steps."""
    return lambda c, rng: _sessions(model, c, rng)


def _sessions(model: str, c: int, rng) -> list[list[bytes]]:
    out = []
    for k in range(c):
        sid = f"exp-{k}-{rng.integers(1 << 30)}"

        def body(extra: dict, sid: str = sid) -> bytes:
            return _request(f"/v1/models/{model}/act", json.dumps({"observation": obs_row(rng), "session_id": sid,
                                                                     **extra}).encode())

        steps = [body({"reward": 1.0}) for _ in range(8)]
        episode = ([body({"episode_start": True})] + [steps[i % 8] for i in range(EPISODE - 1)]
                   + [body({"reward": 1.0, "terminated": True})])
        out.append(episode)
    return out


def paired(on: tuple, off: tuple, c: int, args, rng) -> tuple[list[float], list[float]]:
    """Rounds of (on, off) back to back, alternating the order: per round the req/s ratio
    and the ratio of server CPU per request (off / on: the share of CPU the log leaves to
    serving, which other load on a shared machine disturbs less than req/s)."""
    ratios, cpu_ratios = [], []
    what = " + shadow" if args.shadow else ""
    if args.shadow_both:
        what = " (with its shadow columns; both servers run the shadow)"
    print(f"\n{args.model} 1 obs session steps, experience log{what} on / off "
          f"(c={c}, {args.rounds} rounds of {args.duration:g} s a side)")
    for i in range(args.rounds):
        got = {}
        for side in (("on", "off") if i % 2 == 0 else ("off", "on")):
            proc, port = on if side == "on" else off
            got[side] = load(port, sessions(args.model), c, args, rng, proc.pid)
        ratios.append(got["on"]["req_s"] / got["off"]["req_s"])
        cpu_ratios.append(got["off"]["cpu_us"] / got["on"]["cpu_us"])
        print(f"  round {i + 1}: {got['on']['req_s']:7.0f} vs {got['off']['req_s']:7.0f} req/s  ratio "
              f"{ratios[-1]:.2f}  server CPU {got['on']['cpu_us']:5.0f} vs {got['off']['cpu_us']:5.0f} us/request "
              f"(off/on {cpu_ratios[-1]:.2f})  p99 {got['on']['p99_ms']:.1f} vs {got['off']['p99_ms']:.1f} ms  "
              f"errors {got['on']['errors']}/{got['off']['errors']}", flush=True)
    return ratios, cpu_ratios


def turns(on: tuple, off: tuple, c: int, args, rng) -> tuple[dict, dict]:
    """The two servers in turns (``bench_interleaved``): what each side measured."""
    what = " (with its shadow columns; both servers run the shadow)" if args.shadow_both else \
        (" + shadow" if args.shadow else "")
    print(f"\n{args.model} 1 obs session steps, experience log{what} on / off (c={c}, {args.slices} slices of "
          f"{args.slice:g} s a side, in turns)")
    make = sessions(args.model)
    got_on, got_off = interleaved([(on[1], on[0].pid), (off[1], off[0].pid)], [make(c, rng), make(c, rng)],
                                  slices=args.slices, slice_s=args.slice, warmup_s=args.warmup)
    for side, got in (("on", got_on), ("off", got_off)):
        print(f"  log {side:3s}: {got['req_s']:7.0f} req/s  server CPU {got['cpu_us']:5.0f} us/request  "
              f"p50 {got['p50_ms']:.2f} ms  p99 {got['p99_ms']:.1f} ms  errors {got['errors']}", flush=True)
    ratio, cpu_ratio = got_on["req_s"] / got_off["req_s"], got_off["cpu_us"] / got_on["cpu_us"]
    low, mid, high = quartiles(block_ratios(got_on, got_off))
    print(f"  req/s on / off {ratio:.3f} (blocks of four slices: median {mid:.2f}, quartiles {low:.2f}-{high:.2f});"
          f" server CPU per request off / on {cpu_ratio:.3f}")
    return got_on, got_off


def pooled(runs: list[tuple[dict, dict]], c: int) -> None:
    """Every pair's figures at ``c`` together: two server processes differ by several percent
    from one start to the next even in turns, so one pair alone does not settle 10%."""
    on_req, off_req = sum(a["requests"] for a, _ in runs), sum(b["requests"] for _, b in runs)
    on_cpu = sum(a["cpu_us"] * a["requests"] for a, _ in runs) / on_req
    off_cpu = sum(b["cpu_us"] * b["requests"] for _, b in runs) / off_req
    each = ", ".join(f"{b['cpu_us'] / a['cpu_us']:.3f}" for a, b in runs)
    req = statistics.fmean(a["req_s"] / b["req_s"] for a, b in runs)
    print(f"c={c}, {len(runs)} pairs of servers: server CPU per request off / on {off_cpu / on_cpu:.3f} "
          f"(per pair: {each}); req/s on / off, mean of the pairs, {req:.3f} (target >= 0.9)")


def counters(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = re.findall(r'^(rlserve_(?:experience|shadow)_[a-z_]+)(\{[^}]*\})? (\S+)$', text, re.M)
    return {f"{name}{labels}": float(value) for name, labels, value in found if not name.endswith("_created")}


TOKEN = "bench-experience"  # the servers' admin token, to read the shadow's state


def candidate_loaded(port: int, model: str, timeout: float = 120.0) -> None:
    """Wait until the server's shadow has loaded its candidate: loading costs seconds of CPU,
    which must not land in either side's measured slices."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/admin/models/{model}/shadow",
                                     headers={"authorization": f"Bearer {TOKEN}"})
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(request, timeout=30) as response:
            state = json.loads(response.read())["state"]
        if state != "starting" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if state != "running":
        raise SystemExit(f"the shadow of {model} did not start: {state}")


def second_version(repo: Path, model: str) -> None:
    """``model`` again as version 2 (current: sessions go to it; version 1 shadows it)."""
    import shutil

    from rlserve.models.export.bundle import MANIFEST_NAME, write_manifest

    shutil.copytree(repo / model, repo / f"{model}_v2")
    data = json.loads((repo / f"{model}_v2" / MANIFEST_NAME).read_text())
    data["version"] = "2"
    write_manifest(repo / f"{model}_v2", data, list(data["files"]))


def main() -> None:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", choices=["interleaved", "rounds"], default="interleaved")
    parser.add_argument("--slices", type=int, default=40, help="interleaved: slices a side")
    parser.add_argument("--slice", type=float, default=0.5, help="interleaved: seconds a slice")
    parser.add_argument("--pairs", type=int, default=3, help="interleaved: fresh pairs of servers, one after the other")
    parser.add_argument("--duration", type=float, default=4.0, help="rounds: seconds a round")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5, help="rounds: rounds a side")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64])
    parser.add_argument("--model", choices=["mlp", "lstm"], default="mlp")
    parser.add_argument("--shadow", action="store_true", help="the log's side runs a shadow candidate too")
    parser.add_argument("--shadow-both", action="store_true",
                        help="both servers run the shadow candidate; only the log (with its shadow columns) differs")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=(os.cpu_count() or 1) >= 2)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(machine_line())
    if args.pin:
        bench_server.SERVER_CPUS, bench_server.LOAD_CPUS = {0}, {1}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        build_bundles(work / "repo")
        log_env: dict[str, str] = {}
        off_env: dict[str, str] = {}
        if args.shadow or args.shadow_both:
            second_version(work / "repo", args.model)
            log_env["RLSERVE_SHADOW"] = json.dumps({args.model: {"candidate": f"{args.model}@1", "version": "2"}})
            log_env["RLSERVE_ADMIN_TOKEN"] = TOKEN
            if args.shadow_both:
                off_env.update(RLSERVE_SHADOW=log_env["RLSERVE_SHADOW"], RLSERVE_ADMIN_TOKEN=TOKEN)
        if args.method == "rounds":
            rounds(work, log_env, off_env, args, rng)
            return
        runs: dict[int, list[tuple[dict, dict]]] = {c: [] for c in args.concurrency}
        for pair in range(args.pairs):
            print(f"\npair {pair + 1} of {args.pairs}: two fresh servers")
            on = start_rlserve(work / "repo", {**log_env, "RLSERVE_EXPERIENCE_LOG": str(work / f"log{pair}")})
            off = start_rlserve(work / "repo", off_env)
            try:
                for env, (_, port) in ((log_env, on), (off_env, off)):
                    if "RLSERVE_SHADOW" in env:
                        candidate_loaded(port, args.model)
                for c in args.concurrency:
                    runs[c].append(turns(on, off, c, args, rng))
                show_counters(on[1], off[1])
            finally:
                stop(on[0])
                stop(off[0])
        print()
        for c, got in runs.items():
            pooled(got, c)
        written(work)


def rounds(work: Path, log_env: dict, off_env: dict, args, rng) -> None:
    """The earlier design: one pair of servers, rounds of seconds a side."""
    on = start_rlserve(work / "repo", {**log_env, "RLSERVE_EXPERIENCE_LOG": str(work / "log0")})
    off = start_rlserve(work / "repo", off_env)
    try:
        for c in args.concurrency:
            ratios, cpu_ratios = paired(on, off, c, args, rng)
            print(f"c={c}: log on / off, req/s: median {statistics.median(ratios):.2f} (target >= 0.9), rounds "
                  f"meeting it {sum(r >= 0.9 for r in ratios)}/{len(ratios)}; server CPU per request, off / on: "
                  f"median {statistics.median(cpu_ratios):.2f}")
        show_counters(on[1], off[1])
    finally:
        stop(on[0])
        stop(off[0])
    written(work)


def show_counters(on_port: int, off_port: int) -> None:
    for side, port in (("log on", on_port), ("log off", off_port)):
        for name, value in sorted(counters(port).items()):
            print(f"  {side}: {name} {value:.0f}")


def written(work: Path) -> None:
    files = sorted(work.glob("log*/**/*.parquet"))
    size = sum(f.stat().st_size for f in files)
    print(f"  {len(files)} Parquet files, {size / 1e6:.1f} MB written")


if __name__ == "__main__":
    main()
