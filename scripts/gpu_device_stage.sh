#!/usr/bin/env bash
# Stage what scripts/gpu_device_check.sh needs on a lent GPU machine that has no network and
# takes at most 64 MiB of working tree per call (the device tool of this workplace):
#
#   scripts/gpu_device_stage.sh [ORACLE_DIR]      # default ../shared/oracle
#
# It writes, in the repository root (all three are meant to be ignored by git: add them to
# .git/info/exclude, as this script does):
#   .whl/       the Python 3.12 wheels the machine lacks (scripts/gpu_device_wheels.txt)
#   .oracle/    a copy of the oracle's fixtures (the gpu conformance tests read them)
#   .gpuw1..N/  onnxruntime-gpu (CUDA 13 build, ~256 MB) cut into parts small enough to
#               travel one per call beside the tree, with its sha256
# and prints the calls to make, in order, each right after the one before (a machine stays
# warm for only ~30 s between calls; /tmp survives while it is warm):
#   N calls carrying .gpuwK:  mkdir -p /tmp/ortgpu && cp .gpuwK/* /tmp/ortgpu/
#   one call carrying .whl and .oracle: join the parts, check the sum, run the check.
set -euo pipefail
cd "$(dirname "$0")/.."
oracle=${1:-../shared/oracle}
part_mb=${PART_MB:-50}
ort_version=$(sed -n 's/^# onnxruntime-gpu==\([0-9.]*\).*/\1/p' scripts/gpu_device_wheels.txt)
ort_version=${ort_version:-1.31.1}

for path in /.whl/ /.oracle/ /.gpuw*/; do
  grep -qxF "$path" .git/info/exclude 2>/dev/null || echo "$path" >>.git/info/exclude
done

fetch() {  # the device's interpreter is CPython 3.12 on x86-64 (manylinux)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 "$@"
}

rm -rf .whl .oracle .gpuw*
mkdir -p .whl
fetch -d .whl -r scripts/gpu_device_wheels.txt

mkdir -p .oracle
cp -r "$oracle/fixtures" "$oracle/fixtures-next" .oracle/

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fetch -d "$scratch" "onnxruntime-gpu==$ort_version"
wheel=$(cd "$scratch" && ls onnxruntime_gpu-*.whl)
(cd "$scratch" && sha256sum "$wheel" >SHA256 && split -b "${part_mb}M" -d -a 1 "$wheel" part)
count=0
for part in "$scratch"/part?; do
  count=$((count + 1))
  mkdir -p ".gpuw$count"
  mv "$part" ".gpuw$count/"
done
cp "$scratch/SHA256" .gpuw1/

tree_mb=$(git ls-files -z | xargs -0 du -cm 2>/dev/null | tail -1 | cut -f1)
echo "staged: .whl ($(du -sm .whl | cut -f1) MB), .oracle ($(du -sm .oracle | cut -f1) MB)," \
     "$count parts of onnxruntime-gpu $ort_version in .gpuw1..$count; tracked tree ~${tree_mb} MB"
echo
echo "device calls, in order, without pausing between them:"
for k in $(seq 1 "$count"); do
  echo "  carry [.gpuw$k]:  mkdir -p /tmp/ortgpu && cp .gpuw$k/* /tmp/ortgpu/ && ls /tmp/ortgpu"
done
echo "  carry [.whl, .oracle], timeout_s 590:"
echo "    cd /tmp/ortgpu && cat part? > $wheel && sha256sum -c SHA256 && rm part? && cd - >/dev/null" \
     "&& DEADLINE_S=480 bash scripts/gpu_device_check.sh; echo \"gpu_device_check exit \$?\""
