"""The experience log's CPU per recorded step, in process (not a test: it prints numbers).

What ``bench_experience.py --model lstm --shadow-both`` measures over HTTP, without HTTP
or the load generator in the way: thread CPU time (``time.thread_time``, and the writer
threads' own CPU clocks), not wall time, which other processes on the same cores move much
less (a busy machine still inflates it by a third or so: compare runs made side by side).

The bench LSTM bundle (``bench_server.build_bundles``) in a ``ModelRegistry`` with the
log on, as the server builds it; ``--concurrency`` sessions each play episodes of
``--episode`` steps (a first step that starts the episode, steps with a reward, the last
observation with ``terminated``), one request per session per batch, accepted through
``ActService`` and run as one batch by the model's ``BatchStep`` (what the batcher does),
so the recorder runs exactly as on the act path. Per batch it times

- the event loop's side: ``Recorder.record`` (and ``emit``), what a request waits on;
- the server's writer thread: its thread CPU over the run (columns and episodes forms);
- the shadow's columns: a candidate's ``ShadowScore`` per logged step as its runner
  builds them (``ShadowRunner._write``; here with a fixed logp, action and 4 dist inputs),
  offered to a writer of its own (in the server, the candidate's process), its thread CPU
  likewise.

The writers run on a clock of the steps' own (``--rate`` steps a second), so each file holds
a second's rows at that rate whatever the machine's speed, and the garbage collector is set
as ``rlserve serve`` sets it (``settle_heap``); its passes are reported too.

    python scripts/bench_experience_cost.py [--steps 20000] [--concurrency 16] [--episode 100] [--repeat 3]
        [--rate 3000]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from bench_report import cpu_model  # noqa: E402
from bench_scenarios import build_bundles, obs_row  # noqa: E402


def thread_cpu(thread) -> float:
    """CPU seconds ``thread`` (a running ``threading.Thread``) used so far."""
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


class Collections:
    """Thread CPU of the garbage collector's passes, per thread name (``gc.callbacks``)."""

    def __init__(self):
        self.cpu: dict[str, float] = {}
        self._started: dict[int, float] = {}

    def __call__(self, phase, info):
        ident = threading.get_ident()
        if phase == "start":
            self._started[ident] = time.thread_time()
        elif ident in self._started:
            name = threading.current_thread().name
            self.cpu[name] = self.cpu.get(name, 0.0) + time.thread_time() - self._started.pop(ident)


class Timed:
    """A recorder that counts the thread CPU its calls take (not the batch's JSON lists of
    actions and logps, which the answers make anyway and the recorder only reads)."""

    def __init__(self, recorder):
        self.recorder = recorder
        self.cpu = 0.0

    def record(self, steps, results, *, emit, **batch):
        for result in results[:1]:  # the answers' JSON lists, made once per batch: not the log's cost
            made = result.batch.actions_json, result.batch.logp
            assert made
        t0 = time.thread_time()
        self.recorder.record(steps, results, emit=emit, **batch)
        self.cpu += time.thread_time() - t0

    def emit(self, steps, stands):
        t0 = time.thread_time()
        self.recorder.emit(steps, stands)
        self.cpu += time.thread_time() - t0


def run(repo: Path, log_dir: Path, args, rng) -> dict[str, float]:
    import numpy as np

    from rlserve.service.act.use_case import ActService
    from rlserve.service.act.wire import decode_request
    from rlserve.service.experience.log import ExperienceLog
    from rlserve.service.experience.records import ModelLog, ShadowScore, packer
    from rlserve.service.experience.writer import ExperienceWriter
    from rlserve.service.server import settle_heap
    from rlserve.service.serving.registry import ModelRegistry
    from rlserve.service.settings import Settings

    settings = Settings()
    # The writers' clock is the steps' own: ``--rate`` steps a second, however fast this loop
    # runs, so each file holds the rows of a second of that rate (as a server's do) whether
    # the machine is busy or not.
    clock = [0.0]
    experience = ExperienceLog(log_dir, clock=lambda: clock[0])
    registry = ModelRegistry(settings, None, experience=experience)
    policy = registry.load_policy(repo / "lstm")
    registry.add(policy)
    timed = Timed(policy.step.recorder)
    policy.step.recorder = timed
    model = experience.model_log("lstm")
    assert isinstance(model, ModelLog)
    shadow_writer = ExperienceWriter(log_dir, source="shadow", clock=lambda: clock[0])
    service = ActService(registry)

    c = args.concurrency
    ids = [f"cost-{k}-{rng.integers(1 << 30)}" for k in range(c)]
    rows = [obs_row(rng) for _ in range(8)]

    def body(k: int, t: int) -> bytes:
        extra = {"episode_start": True} if t == 0 else {"reward": 1.0}
        if t == args.episode:
            extra["terminated"] = True
        return json.dumps({"observation": rows[(k + t) % 8], "session_id": ids[k], **extra}).encode()

    bodies = [[decode_request(body(k, t)) for t in range(args.episode + 1)] for k in range(c)]
    settle_heap()  # the garbage collector as `rlserve serve` sets it once the models are loaded
    collections = Collections()
    gc.callbacks.append(collections)
    batches = args.steps // c
    shadow_cpu = 0.0
    label = "lstm@1"
    action_pack = packer(model.action_space)
    dist = np.zeros(4, np.float32)
    writer_thread, shadow_thread = experience.writer._thread, shadow_writer._thread
    writer0, shadow0 = thread_cpu(writer_thread), thread_cpu(shadow_thread)
    logged = 0
    for b in range(batches):
        t = b % (args.episode + 1)
        clock[0] += c / args.rate
        accepted = [service.accept("lstm", None, bodies[k][t], 0.0) for k in range(c)]
        steps = [a.step for a in accepted]
        policy.step.run(steps)
        for a in accepted:
            service.abandon(a)
        t0 = time.thread_time()
        now = time.time()
        scores = [ShadowScore(s.event_ids[0], label, -1.0, action_pack(0), dist.tobytes(), now)
                  for s in steps if s.event_ids is not None and s.event_ids[0] is not None]
        logged += len(scores)
        if scores:
            shadow_writer.offer_shadow(model, scores)
        shadow_cpu += time.thread_time() - t0
    experience.writer.flush()
    shadow_writer.flush()
    gc.callbacks.remove(collections)
    writer_cpu = thread_cpu(writer_thread) - writer0
    shadow_writer_cpu = thread_cpu(shadow_thread) - shadow0
    rows_written = experience.writer.written.get("columns", 0)
    files = len(list(log_dir.glob("lstm/columns/*.parquet")))
    experience.close()
    shadow_writer.close()
    return {"steps": batches * c, "logged": logged, "written": rows_written, "files": files,
            "loop_us": 1e6 * timed.cpu / logged, "writer_us": 1e6 * writer_cpu / logged,
            "shadow_build_us": 1e6 * shadow_cpu / logged, "shadow_writer_us": 1e6 * shadow_writer_cpu / logged,
            "gc_loop_us": 1e6 * collections.cpu.get("MainThread", 0.0) / logged,
            "gc_writer_us": 1e6 * collections.cpu.get("experience-writer", 0.0) / logged}


def main() -> None:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20_000, help="session steps per run")
    parser.add_argument("--concurrency", type=int, default=16, help="sessions: requests per batch")
    parser.add_argument("--episode", type=int, default=100, help="steps per episode")
    parser.add_argument("--repeat", type=int, default=3, help="runs (the median is printed)")
    parser.add_argument("--rate", type=float, default=3000.0,
                        help="steps a second of the writers' clock (a file a second: its rows)")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(f"machine: {platform.machine()} {cpu_model()} cpus={os.cpu_count()} "
          f"python={platform.python_version()} load={load:.2f} (thread CPU time; other load still inflates it)")
    rng = np.random.default_rng(0)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        build_bundles(Path(tmp) / "repo")
        for i in range(args.repeat):
            results.append(run(Path(tmp) / "repo", Path(tmp) / f"log{i}", args, rng))
    first = results[0]
    print(f"lstm session steps, c={args.concurrency} a batch, episodes of {args.episode}, {args.rate:g} steps/s of "
          f"the writers' clock: {first['steps']} steps, {first['logged']} logged, {first['written']} transitions "
          f"written in {first['files']} files (per run; {args.repeat} runs)")
    for key, what in (("loop_us", "event loop: Recorder.record + emit"),
                      ("writer_us", "writer thread (columns + episodes)"),
                      ("shadow_build_us", "shadow scores built (candidate's process)"),
                      ("shadow_writer_us", "shadow writer thread (shadow/ table)"),
                      ("gc_loop_us", "garbage collection, main thread (all of it)"),
                      ("gc_writer_us", "garbage collection, writer threads")):
        values = [r[key] for r in results]
        print(f"  {what:45s} {statistics.median(values):6.2f} us CPU per logged step  "
              f"(runs: {', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
