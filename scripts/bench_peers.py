"""rlserve beside the serving systems a user would pick instead (not a test: it prints numbers).

Serves bench_server.py's networks (the MLP 256x256 with its value head, and the same layers
inside an LSTM(256)), with the same weights, from:

    rlserve | a plain FastAPI app with eager torch | LitServe (its batching) |
    Ray Serve (``@serve.batch``) | mosec (dynamic batching) | PyTriton | the minimal ASGI app

Each peer is a small app of its own under scripts/peers/ (policy_net.py holds the networks
in plain torch), run by the python of a virtual environment this script makes for it under
``--cache`` (reused while its requirements are unchanged; ``--no-install`` skips a peer
whose environment is not there). rlserve and the minimal app (bench_server.py's) run in
this environment. Scenarios, each at ``--concurrency`` (1, 16, 64):

    MLP, 1 observation per request | MLP, 64 per request | LSTM, 1 per request, state per client

Every system answers the same request bodies (rlserve's act bodies; only the path differs),
sent by bench_server.py's load generator. Servers are pinned as bench_server.py pins them
(CPU 0; the load generator on CPU 1; their child processes inherit it), only the system
being measured runs (the others' process trees are paused with SIGSTOP), and the rounds of
a cell alternate the order of the systems (A B C ..., then ... C B A). Server CPU per
request is read from /proc for the server's whole process tree. The results file
(bench_peers_results.py) keeps every cell, the machine, and its load average before and after.

    python scripts/bench_peers.py --duration 4 --rounds 3 --json docs/bench-peers.json
    python scripts/bench_peers.py --systems rlserve minimal fastapi --no-install --duration 0.5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_server as bench  # noqa: E402  (the sibling script: servers, pinning, the load generator)
from bench_peers_results import SCENARIOS, cell_result, results_table, systems_table  # noqa: E402
from bench_procs import kill_tree_after, signal_tree  # noqa: E402
from bench_report import cpu_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PEERS_DIR = Path(__file__).resolve().parent / "peers"
TORCH = "torch==2.13.0"  # the local CPU wheel; a bare newer torch would be a CUDA build
MAX_BATCH, WAIT_S = 64, 0.001  # the batching peers' settings: requests per batch, wait for more


@dataclass(frozen=True)
class System:
    key: str
    label: str
    app: str | None  # scripts/peers/<app>; None: rlserve or the minimal app, run here
    requirements: tuple[str, ...]  # of its own virtual environment
    path: str  # where it answers act bodies
    health: str  # a GET that answers 200 once it serves
    batching: str
    state: str
    python: str | None = None  # the Python version its environment is made with (default: this one)
    oip: bool = False  # takes the Open Inference Protocol's JSON tensors, runs the bundle's ONNX graph


SYSTEMS = [
    System("rlserve", "rlserve", None, (), "", "/readyz",
           "its batcher (defaults: up to 1,024 rows, no wait: what is queued)",
           "server-side sessions (`session_id`)"),
    System("fastapi", "FastAPI + eager torch", "peer_fastapi.py",
           ("fastapi==0.165.0", "uvicorn[standard]==0.54.0", TORCH), "/act", "/health",
           "none: one forward per request (a sync path operation, FastAPI's thread pool)",
           "a dict in its one process, keyed by `session_id` (written for this benchmark)"),
    System("litserve", "LitServe", "peer_litserve.py", ("litserve==0.2.19", TORCH), "/predict", "/health",
           f"`max_batch_size={MAX_BATCH}`, `batch_timeout={WAIT_S}` s; one inference worker",
           "a dict in its one inference worker, keyed by `session_id` (written for this benchmark)"),
    System("rayserve", "Ray Serve", "peer_rayserve.py", ("ray[serve]==2.60.0", TORCH), "/act", "/act",
           f"`@serve.batch(max_batch_size={MAX_BATCH}, batch_wait_timeout_s={WAIT_S})`; one replica",
           "a dict in its one replica, keyed by `session_id` (written for this benchmark)"),
    System("mosec", "mosec", "peer_mosec.py", ("mosec==0.9.8", TORCH), "/inference", "/",
           f"`max_batch_size={MAX_BATCH}`, `max_wait_time=1` ms; one worker",
           "a dict in its one worker process, keyed by `session_id` (written for this benchmark)"),
    System("pytriton", "PyTriton", "peer_pytriton.py", ("nvidia-pytriton==0.7.0", "onnxruntime==1.32.0"),
           "/v2/models/policy/infer", "/v2/models/policy/ready",
           "Triton's dynamic batcher: up to 1,024 rows, `max_queue_delay_microseconds=1000`",
           "no server-side state: not measured with the LSTM", python="3.12", oip=True),
    System("minimal", "minimal ASGI app (floor)", None, (), "/", "/",
           "none (answers a fixed body, runs no model)", "none (runs no model)"),
]
BY_KEY = {s.key: s for s in SYSTEMS}


# --------------------------------------------------------------------------- environments

def ensure_venv(cache: Path, system: System, install: bool) -> Path:
    """The python of ``system``'s virtual environment, made (or remade) when its requirements
    changed; with ``install`` false a missing one raises LookupError."""
    env = cache / system.key
    python = env / "bin" / "python"
    marker = env / "rlserve-bench-requirements.txt"
    wanted = "\n".join(system.requirements) + "\n"
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    if not install:
        raise LookupError(f"no environment in {env} (run without --no-install to make it)")
    base = find_python(system.python) if system.python else sys.executable
    print(f"making {env} ({' '.join(system.requirements)}) ...", flush=True)
    subprocess.run([base, "-m", "venv", "--clear", str(env)], check=True, timeout=600)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *system.requirements], check=True, timeout=3600)
    marker.write_text(wanted)
    return python


def find_python(version: str) -> str:
    """An interpreter of ``version`` with its shared libpython (PyTriton's Python backend
    loads it): on the PATH, or one of pyenv's."""
    candidates = [f"python{version}", *sorted(str(p) for p in (Path.home() / ".pyenv" / "versions").glob(
        f"{version}.*/bin/python{version}"))]
    code = "import sysconfig, sys; sys.exit(not sysconfig.get_config_var('Py_ENABLE_SHARED'))"
    for candidate in candidates:
        try:
            if subprocess.run([candidate, "-c", code], capture_output=True, timeout=60).returncode == 0:
                return candidate
        except OSError:
            continue
    raise LookupError(f"no python{version} with a shared libpython (PyTriton's Python backend needs one)")


def versions(python: Path | str, system: System) -> dict[str, str]:
    names = [r.split("==")[0].split("[")[0] for r in system.requirements]
    code = ("import importlib.metadata as m, sys, json; "
            "print(json.dumps({'python': sys.version.split()[0], **{n: m.version(n) for n in sys.argv[1:]}}))")
    done = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


# --------------------------------------------------------------------------- servers

def stop_tree(proc: subprocess.Popen) -> None:
    """Stop a server and every process it started (Ray's and mosec's keep running otherwise)."""
    kill_tree_after(proc.pid, lambda: bench.stop(proc))


def start_peer(system: System, python: Path, model: str, weights: Path, logs: Path) -> tuple[subprocess.Popen, int]:
    port = bench.free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PYTHONPATH"] = str(PEERS_DIR)  # policy_net, also for the processes a peer spawns
    libdir = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
                            capture_output=True, text=True, timeout=60).stdout.strip()
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [libdir, env.get("LD_LIBRARY_PATH")]))
    log = (logs / f"{system.key}-{model}.log").open("wb")
    proc = subprocess.Popen([str(python), str(PEERS_DIR / system.app), "--model", model, "--weights", str(weights),
                             "--port", str(port), "--max-batch", str(MAX_BATCH), "--wait-s", str(WAIT_S)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=bench._pinned)
    try:
        bench.wait_ready(port, system.health, proc, timeout=240)
    except RuntimeError as exc:
        stop_tree(proc)
        tail = (logs / f"{system.key}-{model}.log").read_text(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"{exc}: {' / '.join(tail)}") from None
    return proc, port


def save_weights(models: dict, out: Path) -> dict[str, Path]:
    """rlserve's catalog models' weights under policy_net's names, one file per model."""
    import torch

    renames = [("base._hidden_layers.0._model.0.", "hidden.0."), ("base._hidden_layers.1._model.0.", "hidden.2."),
               ("base._logits._model.0.", "logits."), ("_logits_branch._model.0.", "logits."),
               ("base._value_branch._model.0.", "value."), ("_value_branch._model.0.", "value.")]
    paths = {}
    for name, model in models.items():
        state = {}
        for key, tensor in model.state_dict().items():
            for old, new in renames:
                if key.startswith(old):
                    key = new + key[len(old):]
                    break
            state[key] = tensor.detach().clone()
        paths[name] = out / f"{name}.pt"
        torch.save(state, paths[name])
    return paths


# --------------------------------------------------------------------------- runs

def for_system(requests: list[list[bytes]], system: System) -> list[list[bytes]]:
    """The same requests for another system: rlserve's act path replaced by the system's, or
    the same observations as Open Inference Protocol JSON tensors."""
    path = system.path
    if system.oip:
        return [[for_oip(r, path) for r in conn] for conn in requests]
    if not path:
        return requests
    return [[r.replace(b"/v1/models/mlp/act ", f"{path} ".encode(), 1)
             .replace(b"/v1/models/lstm/act ", f"{path} ".encode(), 1) for r in conn] for conn in requests]


def for_oip(request: bytes, path: str) -> bytes:
    body = json.loads(request.split(b"\r\n\r\n", 1)[1])
    rows = body.get("observations") or [body["observation"]]
    tensor = {"name": "obs", "shape": [len(rows), len(rows[0])], "datatype": "FP32",
              "data": [x for row in rows for x in row]}
    return bench._request(path, json.dumps({"inputs": [tensor]}).encode())


MAKERS = {"mlp1": bench.mlp_single, "mlp64": bench.mlp_batch64, "lstm": bench.lstm_sessions}


def measure_model(model: str, servers: dict[str, tuple[subprocess.Popen, int]], args, rng) -> list[dict]:
    """Every cell of one model's scenarios, rounds alternating the order of the servers. Only
    the server being measured runs: the others' process trees are stopped (SIGSTOP) meanwhile,
    since an idle server polling its queues (LitServe's worker, Ray's cluster) would take CPU 0
    from the one measured."""
    out = []
    for scenario, (label, _, served) in SCENARIOS.items():
        if served != model or scenario not in args.scenarios:
            continue
        here = [key for key in servers if not (scenario == "lstm" and key == "pytriton")]
        for c in args.concurrency:
            rounds: dict[str, list[dict]] = {key: [] for key in here}
            for i in range(args.rounds):
                requests = MAKERS[scenario](c, rng)
                for key in (here if i % 2 == 0 else here[::-1]):
                    proc, port = servers[key]
                    for other, (other_proc, _) in servers.items():
                        signal_tree(other_proc.pid, signal.SIGCONT if other == key else signal.SIGSTOP)
                    try:
                        res = bench.run_load(port, for_system(requests, BY_KEY[key]), args.duration,
                                             args.warmup, proc.pid)
                    except RuntimeError as exc:
                        print(f"  {key} {scenario} c={c} round {i + 1}: failed ({exc.__cause__!r})", flush=True)
                        continue
                    rounds[key].append(res)
                    bench.show(f"{label} [{key}] r{i + 1}", c, res, SCENARIOS[scenario][1])
            out.extend(cell_result(key, scenario, c, runs) for key, runs in rounds.items() if runs)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.timing_options(parser, duration=4.0, rounds=3)
    parser.add_argument("--systems", nargs="+", default=[s.key for s in SYSTEMS], choices=list(BY_KEY))
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "rlserve-bench-peers",
                        help="where the peers' virtual environments are kept")
    parser.add_argument("--install", action=argparse.BooleanOptionalAction, default=True,
                        help="make missing environments (--no-install: skip those peers)")
    parser.add_argument("--json", type=Path, default=None, metavar="RESULTS")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=(os.cpu_count() or 1) >= 2,
                        help="servers on CPU 0, the load generator on CPU 1 (default with >= 2 CPUs)")
    args = parser.parse_args()
    if args.pin:
        bench.SERVER_CPUS, bench.LOAD_CPUS = {0}, {1}
    load_before = os.getloadavg()
    commit = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                            text=True).stdout.strip() or "?"  # the code measured, as it was at the start
    bench.machine_state("start")
    chosen = [s for s in SYSTEMS if s.key in args.systems]
    pythons: dict[str, Path | str] = {}
    status: dict[str, str] = {}
    info: dict[str, dict[str, str]] = {}
    for system in chosen:
        try:
            pythons[system.key] = ensure_venv(args.cache, system, args.install) if system.app else sys.executable
            info[system.key] = versions(pythons[system.key], system) if system.app else {}
            status[system.key] = "ran"
        except (LookupError, OSError, subprocess.SubprocessError) as exc:
            status[system.key] = f"not run: {exc}"
            print(f"{system.key}: {status[system.key]}", flush=True)
    if "rlserve" in status:
        import onnxruntime

        info["rlserve"] = {"python": platform.python_version(), "onnxruntime": onnxruntime.__version__}
    rng = np.random.default_rng(0)
    results: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        weights = save_weights(bench.build_bundles(work / "repo"), work)
        for model in ("mlp", "lstm"):
            if not any(SCENARIOS[s][2] == model for s in args.scenarios):
                continue
            servers: dict[str, tuple[subprocess.Popen, int]] = {}
            try:
                for system in chosen:
                    if status[system.key] != "ran" or (model == "lstm" and system.key == "pytriton"):
                        continue
                    try:
                        if system.key == "rlserve":
                            servers["rlserve"] = bench.start_rlserve(work / "repo", {})
                        elif system.key == "minimal":
                            servers["minimal"] = bench.start_minimal(work)
                        else:
                            graph = work / "repo" / model / "model_policy.onnx"  # the bundle's own
                            servers[system.key] = start_peer(system, Path(pythons[system.key]), model,
                                                             graph if system.oip else weights[model], work)
                    except RuntimeError as exc:
                        status[system.key] = f"not run: did not start ({exc})"
                        print(f"{system.key}: {status[system.key]}", flush=True)
                results.extend(measure_model(model, servers, args, rng))
            finally:
                for proc, _ in servers.values():
                    stop_tree(proc)
    data = {
        "command": " ".join(["python", *sys.argv]), "when": time.strftime("%Y-%m-%d %H:%M %Z"),
        "commit": commit,
        "machine": {"cpu": cpu_model(), "nproc": os.cpu_count(), "python": platform.python_version(),
                    "pinned": "servers on CPU 0, load generator on CPU 1" if args.pin else "no",
                    "loadavg_before": [round(x, 2) for x in load_before],
                    "loadavg_after": [round(x, 2) for x in os.getloadavg()]},
        "settings": {"duration_s": args.duration, "warmup_s": args.warmup, "rounds": args.rounds,
                     "concurrency": args.concurrency},
        "systems": [{"key": s.key, "label": s.label, "versions": info.get(s.key, {}), "batching": s.batching,
                     "state": s.state, "status": status[s.key]} for s in chosen],
        "results": results,
    }
    print()
    print(results_table(data))
    print(systems_table(data))
    if args.json is not None:
        args.json.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        print(f"results written to {args.json}", flush=True)
    bench.machine_state("end")


if __name__ == "__main__":
    main()
