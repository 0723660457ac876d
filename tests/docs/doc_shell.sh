# Sourced by the doc runner's shell (tests/docs/doc_session.py) before a page's first block.
# The blocks run verbatim in this one shell, in order, as a reader types them into a
# terminal; two commands behave as a reader's second terminal and installed checkout make
# them behave:
#
#   rlserve serve ...   starts the server in the background and returns once it answers
#                       /healthz (the reader's first terminal); the next `rlserve serve`
#                       of the page stops it first (the docs show serve commands as
#                       alternatives or successive setups, all on port 8000).
#   pip install ...     checks that what it names is installed in this environment (the
#                       suite runs from an editable install of this checkout: reinstalling
#                       would replace it, and take minutes); fails naming what is missing.
#
# $__RL_STATE is the runner's folder for logs; $__RL_TOOLS this folder.

set -o pipefail
__RL_SERVER_PID=""
__RL_SERVE_N=0

rlserve() {
  if [ "${1-}" = serve ] && [[ " $* " != *" --help "* && " $* " != *" -h "* ]]; then
    __rl_serve "$@"
  else
    command rlserve "$@"
  fi
}

pip() {
  python "$__RL_TOOLS/pip_check.py" "$@"
}

__rl_stop_server() {
  [ -n "$__RL_SERVER_PID" ] || return 0
  kill -TERM "$__RL_SERVER_PID" 2>/dev/null
  local waited=0
  while kill -0 "$__RL_SERVER_PID" 2>/dev/null && [ $waited -lt 300 ]; do sleep 0.1; waited=$((waited + 1)); done
  kill -KILL "$__RL_SERVER_PID" 2>/dev/null
  wait "$__RL_SERVER_PID" 2>/dev/null
  __RL_SERVER_PID=""
}

__rl_serve() {
  __rl_stop_server
  local host="${RLSERVE_HOST:-127.0.0.1}" port="${RLSERVE_PORT:-8000}" previous="" arg
  for arg in "$@"; do
    case "$previous" in --port) port="$arg" ;; --host) host="$arg" ;; esac
    case "$arg" in --port=*) port="${arg#--port=}" ;; --host=*) host="${arg#--host=}" ;; esac
    previous="$arg"
  done
  [ "$host" = 0.0.0.0 ] && host=127.0.0.1
  __RL_SERVE_N=$((__RL_SERVE_N + 1))
  local log="$__RL_STATE/serve-$__RL_SERVE_N.log"
  echo "$log" > "$__RL_STATE/current-server-log"
  command rlserve "$@" >"$log" 2>&1 </dev/null &
  __RL_SERVER_PID=$!
  local deadline=$((SECONDS + ${__RL_SERVE_TIMEOUT_S:-180}))
  while [ $SECONDS -lt $deadline ]; do
    if ! kill -0 "$__RL_SERVER_PID" 2>/dev/null; then
      wait "$__RL_SERVER_PID"
      local status=$?
      __RL_SERVER_PID=""
      echo "rlserve serve exited with status $status before it answered; its log ends:" >&2
      tail -n 30 "$log" >&2
      return $((status == 0 ? 1 : status))
    fi
    if curl -s -o /dev/null --max-time 2 "http://$host:$port/healthz"; then
      return 0
    fi
    sleep 0.1
  done
  echo "rlserve serve did not answer http://$host:$port/healthz in time; its log ends:" >&2
  tail -n 30 "$log" >&2
  return 1
}

# One block: its script (written by the runner) is sourced here, so variables, exports and
# background jobs carry over to the next block as in a terminal.
__rl_check() {  # STATUS LINE: remember the first failing line of the block
  if [ "$1" -ne 0 ]; then
    __RL_FAILED="line $2 exited with status $1"
    return 1
  fi
}

__rl_block() {  # SCRIPT STDOUT STDERR DONE
  __RL_FAILED=""
  source "$1" >"$2" 2>"$3" </dev/null
  printf '%s' "$__RL_FAILED" >"$4.tmp"
  mv "$4.tmp" "$4"
}
