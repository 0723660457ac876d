#!/usr/bin/env bash
# Build the CPU image without a Docker engine (buildah), start it, and get an action out of it.
#
#   scripts/container_check.sh                 # from anywhere; works on the repository root
#   CHECK_PORT=18000 scripts/container_check.sh
#
# Steps: refuse to start if something already answers on the port (the check runs on the
# host network, so a teammate's server there would answer for the container); build and
# start the image through the shared container-check tool; POST an observation to the
# default CartPole policy and require an integer action in {0, 1} with a finite logp;
# then inspect the built image: it must run as a non-root user and contain no torch.
#
# Environment:
#   CONTAINER_CHECK  the tool (default: ../shared/tools/container-check next to the checkout)
#   CHECK_PORT       port the image is built to listen on (default 8000; a build arg)
#   CHECK_TIMEOUT    seconds to wait for /healthz (default 180)
#   CHECK_LOG        where the timestamped log goes (default /tmp/rlserve-container-check.log)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
tool=${CONTAINER_CHECK:-$here/../../shared/tools/container-check}
port=${CHECK_PORT:-8000}
timeout=${CHECK_TIMEOUT:-180}
log=${CHECK_LOG:-/tmp/rlserve-container-check.log}
tag=localhost/rlserve-check:latest   # the name the tool gives the image it builds

say() { echo "container_check: $*" >&2; }
[ -x "$tool" ] || { say "no container-check tool at $tool (set CONTAINER_CHECK)"; exit 2; }
if curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$port/"; then
  say "something already listens on 127.0.0.1:$port; it would answer instead of the container." \
      "Stop it or pick another port: CHECK_PORT=NNNN $0"
  exit 2
fi

# The smoke test runs on the host, against the container, with PORT set by the tool.
smoke=$(cat <<'PY'
import json, math, os, urllib.request
base = f"http://127.0.0.1:{os.environ['PORT']}"
with urllib.request.urlopen(base + "/readyz", timeout=10) as r:
    assert r.status == 200, f"/readyz answered {r.status}"
req = urllib.request.Request(
    base + "/v1/models/cartpole/act",
    data=json.dumps({"observation": [0.01, -0.02, 0.03, 0.04], "explore": False}).encode(),
    headers={"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=10) as r:
    body = json.load(r)
print("smoke: act ->", body)
action, logp = body.get("action"), body.get("logp")
assert body.get("model") == "cartpole", f"model: expected 'cartpole', received {body.get('model')!r}"
assert type(action) is int and action in (0, 1), f"action: expected 0 or 1, received {action!r}"
assert isinstance(logp, float) and math.isfinite(logp) and logp <= 0.0, f"logp: expected a finite log-probability, received {logp!r}"
PY
)

stamp() { while IFS= read -r line; do printf '[%(%H:%M:%S)T] %s\n' -1 "$line"; done; }
cd "$root"
say "building and starting the image (log: $log)"
start=$SECONDS
set +e
"$tool" --file Dockerfile --port "$port" --timeout "$timeout" --build-arg "PORT=$port" \
  -- python3 -c "$smoke" 2>&1 | stamp | tee "$log" >&2
status=${PIPESTATUS[0]}
set -e
[ "$status" -eq 0 ] || { say "FAILED: container-check exited $status"; exit 1; }
say "container-check passed in $((SECONDS - start))s"

# The image config must name a non-root user, and the process must really run as it.
user=$(buildah inspect --type image "$tag" | python3 -c 'import json,sys; print(json.load(sys.stdin)["OCIv1"]["config"].get("User", ""))')
case "$user" in
  ""|root|0|0:*|root:*) say "FAILED: the image runs as root (User=${user:-unset})"; exit 1;;
esac
c=$(buildah from "$tag")
trap 'buildah rm "$c" >/dev/null 2>&1 || true' EXIT
facts=$(buildah run --isolation chroot "$c" -- python -c '
import importlib.util, os
print(os.getuid(), importlib.util.find_spec("torch") is None, importlib.util.find_spec("onnxruntime") is not None)')
read -r uid no_torch has_ort <<<"$facts"
[ "$uid" != 0 ] || { say "FAILED: the container process runs with uid 0"; exit 1; }
[ "$no_torch" = True ] || { say "FAILED: torch is installed in the CPU image"; exit 1; }
[ "$has_ort" = True ] || { say "FAILED: onnxruntime is missing from the image"; exit 1; }
buildah run --isolation chroot "$c" -- python -c 'import rlserve.service.protocols.kserve_v2.grpc_server' \
  || { say "FAILED: the gRPC service (the [grpc] extra) does not import in the image"; exit 1; }
say "image user $user (uid $uid), no torch, onnxruntime present, the gRPC service imports"

# The tool reports whole seconds; time one more start to a tenth of a second.
buildah run --isolation chroot --network host "$c" -- rlserve serve >/dev/null 2>&1 &
pid=$!
t0=$(date +%s.%N)
until curl -sf -o /dev/null "http://127.0.0.1:$port/healthz"; do
  kill -0 "$pid" 2>/dev/null || { say "FAILED: the second start exited"; exit 1; }
  sleep 0.1
done
t1=$(date +%s.%N)
kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
say "second start: healthy $(python3 -c "print(f'{$t1 - $t0:.1f}')")s after buildah run"
say "ok"
