#!/usr/bin/env bash
# The GPU check of issue 32, run once on a lent GPU machine, from the repository root, with
# $OUT set (the files written there come back):
#
#   OUT=/path/to/out scripts/gpu_device_check.sh
#
# 1. installs the wheels in .whl/ (scripts/gpu_device_wheels.txt) and onnxruntime-gpu from
#    $ORT_GPU_WHEELS (default /tmp/ortgpu) into $SITE (default /tmp/site) without
#    dependencies or network, then this project, and puts $SITE first on PYTHONPATH; the
#    interpreter's own packages (torch with CUDA, numpy, onnx, onnxscript, pytest) are used
#    as they are. The nvidia-* wheels of that interpreter are linked into $SITE, beside
#    onnxruntime, as a pip install lays them out (onnxruntime.preload_dlls looks there);
# 2. the environment report (scripts/gpu_env_report.py): driver, packages, torch and ONNX
#    Runtime on CUDA. If ONNX Runtime could not load its CUDA provider that way, the
#    nvidia-* library folders go on LD_LIBRARY_PATH and the report runs once more;
# 3. the `gpu` tests (conformance cases and a real server on CUDA), JUnit XML kept;
# 4. scripts/bench_gpu.py (CPU and CUDA in one run);
# 5. a summary: each step's exit status, what ran on CUDA, the tests' CPU/GPU differences
#    in float32 roundoffs, the benchmark's ratios.
#
# No step stops the next one. Every step has a timeout taken from one deadline
# (DEADLINE_S seconds after the start, default 480). Without a GPU it still runs: the gpu
# tests skip (saying what is missing) and the benchmark measures the CPU only.
# Files in $OUT: device-check.log (everything), env.txt, gpu-tests.log, gpu-tests.xml,
# bench.txt, bench.json, summary.txt.

set -u
: "${OUT:?set OUT to the folder whose files come back}"
mkdir -p "$OUT"
PY=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
ORT_GPU_WHEELS=${ORT_GPU_WHEELS:-/tmp/ortgpu}
T0=$(date +%s)
DEADLINE=$((T0 + ${DEADLINE_S:-480}))
STATUS_FILE=$(mktemp)

left() { echo $((DEADLINE - $(date +%s))); }

# step NAME MAX_SECONDS COMMAND...: run it under a timeout, record its exit status.
step() {
  local name=$1 max=$2
  shift 2
  local budget
  budget=$(left)
  ((budget > max)) && budget=$max
  if ((budget < 15)); then
    echo "=== $name: not run (out of time)"
    echo "$name: not run (out of time)" >>"$STATUS_FILE"
    return 1
  fi
  echo
  echo "=== $name (at most ${budget} s, $(date -u +%H:%M:%S) UTC)"
  local t rc
  t=$(date +%s)
  # Through bash -c: the steps are this script's functions (exported below).
  timeout -k 10 "$budget" bash -c "$*"
  rc=$?
  echo "=== $name: exit $rc after $(($(date +%s) - t)) s"
  echo "$name: exit $rc$([ "$rc" = 124 ] && echo ' (timed out)')" >>"$STATUS_FILE"
  return "$rc"
}

install() {
  shopt -s nullglob
  local wheels=(.whl/*.whl "$ORT_GPU_WHEELS"/*.whl)
  shopt -u nullglob
  rm -rf "$SITE"
  mkdir -p "$SITE"
  local rc=0
  echo "wheels: ${#wheels[@]} (${wheels[*]:-none})"
  if ((${#wheels[@]})); then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "${wheels[@]}" || rc=1
  fi
  # --upgrade: the first install made $SITE/bin, which pip would otherwise leave as it is.
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target "$SITE" . || rc=$((rc + 2))
  return "$rc"
}

nvidia_dir() {  # the interpreter's own nvidia-* wheels (torch's), before $SITE is on the path
  PYTHONPATH= "$PY" -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null
}

nvidia_lib_dirs() {
  local dir=$1
  find "$dir" -mindepth 2 -maxdepth 2 -type d -name lib | sort | paste -sd:
}

report() { "$PY" scripts/gpu_env_report.py 2>&1 | tee -a "$OUT/env.txt"; return "${PIPESTATUS[0]}"; }

gpu_tests() {
  local parallel=()
  if "$PY" -c "import xdist" 2>/dev/null; then
    # The server tests stay together on one worker (their xdist_group); the conformance
    # cases spread over the others.
    parallel=(-n 6 --dist loadgroup)
  fi
  # junit_family legacy: the XML keeps each test's record_property values (the roundoffs).
  "$PY" -m pytest -m gpu -p no:cacheprovider -q -rA "${parallel[@]}" --junitxml="$OUT/gpu-tests.xml" -o junit_family=legacy \
    tests/conformance/test_cuda_runtime.py tests/e2e/test_cuda_server_e2e.py 2>&1 | tee "$OUT/gpu-tests.log"
  return "${PIPESTATUS[0]}"
}

bench() {
  local budget=$(($(left) - 60))
  ((budget > 200)) && budget=200
  "$PY" scripts/bench_gpu.py --budget "$budget" --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt"
  return "${PIPESTATUS[0]}"
}

summary() {
  "$PY" - "$OUT" "$STATUS_FILE" <<'PYEOF'
import json, sys, xml.etree.ElementTree as ET
from pathlib import Path

out, status = Path(sys.argv[1]), Path(sys.argv[2])
print("steps:")
print("".join(f"  {line}\n" for line in status.read_text().splitlines()), end="")
env = out / "env.txt"
if env.is_file():
    print("".join(line + "\n" for line in env.read_text().splitlines() if line.startswith("RAN ON CUDA")), end="")
xml = out / "gpu-tests.xml"
if xml.is_file():
    cases = list(ET.parse(xml).getroot().iter("testcase"))
    verdict = {"passed": 0, "failed": 0, "skipped": 0}
    rows = []
    for case in cases:
        kind = "failed" if case.find("failure") is not None or case.find("error") is not None else \
            "skipped" if case.find("skipped") is not None else "passed"
        verdict[kind] += 1
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        if "roundoffs_gpu_vs_rllib" in props:
            rows.append((case.get("name"), props))
    print(f"gpu tests: {verdict}")
    skips = {}
    for case in cases:
        for tag in ("failure", "error"):
            node = case.find(tag)
            if node is not None:
                print(f"  {tag}: {case.get('name')}: {(node.get('message') or '')[:400]}")
        node = case.find("skipped")
        if node is not None:
            skips[node.get("message") or ""] = skips.get(node.get("message") or "", 0) + 1
    for reason, count in sorted(skips.items()):
        print(f"  skipped {count}: {reason[:300]}")
    if rows:
        print("\nCPU/GPU differences, max |diff| in float32 roundoffs of each output's largest value:")
        print("| case / runtime | GPU vs RLlib | CPU vs RLlib | GPU vs CPU |")
        print("|---|---|---|---|")
        for name, p in rows:
            print(f"| {name.split('[', 1)[1].rstrip(']')} | {p.get('roundoffs_gpu_vs_rllib')} | "
                  f"{p.get('roundoffs_cpu_vs_rllib')} | {p.get('roundoffs_gpu_vs_cpu')} |")
        worst = max(rows, key=lambda r: float(r[1]["roundoffs_gpu_vs_rllib"]))
        print(f"largest GPU vs RLlib: {worst[1]['roundoffs_gpu_vs_rllib']} roundoffs ({worst[0]}); limit 512")
bench = out / "bench.json"
if bench.is_file():
    run = json.loads(bench.read_text())
    print(f"\nbenchmark machine: {run['machine']}")
    for cell in run["cells"]:
        where = cell.get("server_device", "?")
        got = cell.get("error") or f"{cell['obs_s']:,.0f} obs/s, p50 {cell['p50_ms']:.2f} ms, errors {cell['errors']}"
        print(f"  {cell['device']:<4} (served on {where}) {cell['model']:<6} workers={cell['workers']:<2} "
              f"rows={cell['rows']:<5} {cell['path']}: {got}")
    print(f"summary: {run['summary']}")
PYEOF
}

export PY SITE ORT_GPU_WHEELS OUT DEADLINE
export -f left install report gpu_tests bench

main() {
  echo "gpu_device_check.sh: $(date -u) on $(hostname), repository $(pwd), deadline $((DEADLINE - T0)) s"
  step "install" 180 install
  local nvidia
  nvidia=$(nvidia_dir)
  if [ -n "$nvidia" ] && [ ! -e "$SITE/nvidia" ]; then
    ln -s "$nvidia" "$SITE/nvidia"
    echo "linked $SITE/nvidia -> $nvidia"
  fi
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="$SITE/bin:$PATH"
  local oracle=()
  for dir in .oracle/fixtures .oracle/fixtures-next tests/fixtures/oracle; do
    [ -d "$dir" ] && oracle+=("$PWD/$dir")
  done
  if ((${#oracle[@]})); then
    RLSERVE_ORACLE_DIR=$(IFS=:; echo "${oracle[*]}")
    export RLSERVE_ORACLE_DIR
  fi
  echo "RLSERVE_ORACLE_DIR=${RLSERVE_ORACLE_DIR:-unset, the default of tests/oracle.py}"
  if ! step "environment report" 120 report && [ -n "$nvidia" ]; then
    LD_LIBRARY_PATH=$(nvidia_lib_dirs "$nvidia")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export LD_LIBRARY_PATH
    echo "onnxruntime did not run on CUDA with preload_dlls alone; again with LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    step "environment report, nvidia libraries on LD_LIBRARY_PATH" 90 report
  fi
  step "gpu tests" 240 gpu_tests
  step "benchmark" 260 bench
  echo
  echo "=== summary ($(($(date +%s) - T0)) s in all)"
  summary | tee "$OUT/summary.txt"
}

set -o pipefail
main 2>&1 | tee "$OUT/device-check.log"
rm -f "$STATUS_FILE"
