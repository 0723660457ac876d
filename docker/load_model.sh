#!/usr/bin/env bash
# Load a policy bundle into a running rlserve over its admin API.
#
#   docker/load_model.sh BUNDLE_OR_ARCHIVE [NAME]
#
# BUNDLE_OR_ARCHIVE is one of:
#   a local .rlsb archive      uploaded as the request body (application/octet-stream);
#   a local bundle directory   packed into an archive first (manifest.json plus the files
#                              it lists, flat, gzip'd tar) and uploaded the same way;
#   anything else              taken as a path inside the *server's* model repository
#                              (RLSERVE_REPOSITORY, /models in the container) and sent as
#                              JSON {"path": ...}; nothing is uploaded.
# NAME, if given, is the model name you expect. A bundle's name comes from its manifest
# (the admin API does not rename), so for a local file the script refuses before loading
# when the manifest says otherwise; for a repository path it checks the server's answer.
#
# Environment: RLSERVE_URL (default http://127.0.0.1:8000), RLSERVE_ADMIN_TOKEN (required;
# the server's admin API is disabled without one). Needs curl and python3 (stdlib only).
# Exit status: 0 loaded; 1 the server refused (its error is printed); 2 bad usage.
set -euo pipefail

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
case "$1" in -h|--help) usage;; esac
source=$1 expected=${2:-}
url=${RLSERVE_URL:-http://127.0.0.1:8000}
token=${RLSERVE_ADMIN_TOKEN:-}
[ -n "$token" ] || { echo "load_model: set RLSERVE_ADMIN_TOKEN (the server's admin token)" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Prints the manifest's model name of a bundle directory or archive; packs a directory
# into $2 when asked. Python's tarfile, so the archive matches what the server accepts.
bundle_tool() {
  python3 - "$@" <<'PY'
import json, sys, tarfile
from pathlib import Path
src = Path(sys.argv[1])
if src.is_dir():
    manifest = json.loads((src / "manifest.json").read_text())
    if len(sys.argv) > 2:
        with tarfile.open(sys.argv[2], "w:gz", format=tarfile.PAX_FORMAT) as tar:
            for name in ["manifest.json", *sorted(manifest.get("files", {}))]:
                tar.add(src / name, arcname=name, recursive=False)
else:
    with tarfile.open(src, "r:*") as tar:
        member = next(m for m in tar.getmembers() if m.name.lstrip("./") == "manifest.json")
        manifest = json.load(tar.extractfile(member))
print(manifest.get("name", ""))
PY
}

check_name() {  # $1: the name found; refuses when NAME was given and differs
  if [ -n "$expected" ] && [ "$1" != "$expected" ]; then
    echo "load_model: $source holds model '$1', not '$expected'" >&2
    exit 1
  fi
}

if [ -f "$source" ] || [ -d "$source" ]; then
  archive=$source pack=()
  if [ -d "$source" ]; then
    archive=$tmp/bundle.rlsb pack=("$tmp/bundle.rlsb")
    [ -f "$source/manifest.json" ] || { echo "load_model: $source has no manifest.json; not a bundle" >&2; exit 2; }
  fi
  name=$(bundle_tool "$source" "${pack[@]}") \
    || { echo "load_model: cannot read a manifest from $source" >&2; exit 2; }
  check_name "$name"
  echo "load_model: uploading $source (model '$name') to $url" >&2
  request=(-H "Content-Type: application/octet-stream" --data-binary "@$archive")
else
  echo "load_model: $source is not a local file or directory; loading it from the server's repository" >&2
  body=$(python3 -c 'import json,sys; print(json.dumps({"path": sys.argv[1]}))' "$source")
  request=(-H "Content-Type: application/json" --data-binary "$body")
fi

code=$(curl -sS -o "$tmp/answer" -w '%{http_code}' -X POST "$url/v1/admin/models" \
  -H "Authorization: Bearer $token" "${request[@]}") || { echo "load_model: no answer from $url" >&2; exit 1; }
cat "$tmp/answer"; echo
if [ "$code" != 201 ]; then
  echo "load_model: the server answered HTTP $code" >&2
  exit 1
fi
loaded=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["name"])' "$tmp/answer")
check_name "$loaded"
