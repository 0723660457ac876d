"""scripts/bench_gpu.py runs end to end on the CPU: bundles exported on the fly (the MLP and
the 84x84x4 uint8 VisionNet), a real server, both binary request paths, the table and the
JSON. Timing is not asserted (the GPU machine's numbers go to docs/benchmarks.md); this
keeps the one command the GPU run depends on from rotting before it gets there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from server_process import run_script

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> Path:
    """The benchmarks' bundles, exported by the first script and reused by the second (--bundles)."""
    return tmp_path_factory.mktemp("bench-bundles")


def test_the_gpu_benchmark_runs_on_the_cpu(tmp_path, bundles):
    out = tmp_path / "bench.json"
    text = run_script("bench_gpu.py", "--devices", "cpu", "--workers", "1", "--rows", "4", "--paths", "oip", "raw",
                      "--duration", "0.5", "--warmup", "0.2", "--clients", "1", "--device-cast", "off",
                      "--bundles", str(bundles), "--json", str(out), timeout=600)
    run = json.loads(out.read_text())
    cells = run["cells"]
    assert {(c["model"], c["path"]) for c in cells} == {("mlp", "oip"), ("mlp", "raw"), ("vision", "oip"),
                                                         ("vision", "raw")}
    for cell in cells:
        assert "error" not in cell, cell
        assert cell["device"] == cell["server_device"] == "cpu" and cell["workers"] == 1 and cell["rows"] == 4
        assert cell["errors"] == 0 and cell["requests"] > 0 and cell["obs_s"] == pytest.approx(4 * cell["req_s"])
        assert cell["inputs_cast_on_device"] is None  # the CPU runtime stages nothing: no cast to report
    assert run["args"]["device_cast"] == "off"
    machine = run["machine"]
    assert machine["cores"] >= 1 and machine["cpu"] and "CPUExecutionProvider" in machine["providers"]
    assert "| model | workers | rows/request |" in text and "targets: MLP on CUDA" in text
    assert text.count("cpu   mlp    w=1  rows=4") == 2 and text.count("cpu   vision w=1  rows=4") == 2


def test_the_frames_benchmark_measures_both_casts(bundles):
    """scripts/bench_frames.py: the host side of VisionNet batches (the GPU server's CPU cost)."""
    text = run_script("bench_frames.py", "--rows", "4", "--requests", "3", "--seconds", "0.2",
                      "--bundles", str(bundles), timeout=600)
    assert "3 requests of 4 uint8 84x84x4 frames per batch" in text and "cpu:" in text
    for label in ("batch cast", "staging cast"):
        line = next(line for line in text.splitlines() if line.strip().startswith(f"{label}:"))
        assert float(line.split(":")[1].split()[0]) > 0, line
