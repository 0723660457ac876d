"""What ``rlserve serve`` checks before it loads anything: one line per refusal.

A start that cannot work is refused (exit status 2) before a model is loaded or a worker
spawned, with one line per problem naming the variable or flag, what was expected and what
was received: settings that do not parse, a missing extra (torch for ``--checkpoint``,
redis for a session store, grpcio for ``--grpc-port``), a repository or checkpoint that
does not exist, a session store that does not answer. No traceback and no third-party text
beyond the failing library's own one-line reason.

The session store is checked here, once, rather than at the first request: a store that
is not there is a configuration mistake (a typo in the URL, a socket that was never
created, Redis not started), and a start that fails says so at once, where the operator
looks. Replicas under an orchestrator (compose's ``restart:``, a Kubernetes pod) are
restarted with back-off until the store answers, which is the retry a degraded start
would otherwise have to implement; a store that goes away after the start answers 503 to
the requests that need it, as before, and stateless requests are still served.
"""

from __future__ import annotations

import errno
import os
import re
import socket
from collections.abc import Collection, Mapping
from typing import Any

from pydantic import ValidationError
from pydantic_settings import SettingsError

from rlserve.models.extras import EXPERIENCE_EXTRA, TORCH_EXTRA, missing
from rlserve.service.serving.checkpoints import cached_export, not_servable, parse_checkpoint_arg
from rlserve.service.sessions.redis_client import redacted
from rlserve.service.settings import PREFIX, Settings, UnknownSetting

# The settings `rlserve serve` also takes as flags (a refusal names the one the user gave).
FLAGS = {"repository": "--repository", "checkpoints": "--checkpoint", "host": "--host", "port": "--port",
         "grpc_port": "--grpc-port", "log_level": "--log-level", "workers": "--workers",
         "device": "--device", "policy_sets": "--policy-set"}
_SHOWN = 60  # characters of a received value a refusal repeats


class StartRefused(Exception):
    """The start cannot work; ``lines`` say why, one problem each."""

    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))
        self.lines = lines


def load_settings(overrides: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Settings:
    """``Settings(**overrides)`` (the flags) over the environment; refusals name the
    variable or flag, never pydantic's field names or its web pages."""
    environ = os.environ if environ is None else environ
    try:
        return Settings(**overrides)
    except UnknownSetting as exc:
        raise StartRefused(str(exc).splitlines()) from None
    except ValidationError as exc:
        raise StartRefused([_invalid(error, overrides, environ) for error in exc.errors()]) from None
    except SettingsError as exc:  # a list-valued variable that is not JSON
        raise StartRefused([_unparsed(exc, environ)]) from None


def setting_name(field: str, given: Collection[str]) -> str:
    """The flag when the user gave the flag, else the environment variable."""
    return FLAGS[field] if field in given and field in FLAGS else PREFIX + field.upper()


def shown(value: Any) -> str:
    """A received value as a refusal repeats it: quoted, and short."""
    text = repr(value)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN - 3]}...' ({len(str(value))} characters)"


def _env_value(field: str, environ: Mapping[str, str]) -> str | None:
    key = PREFIX + field.upper()
    return next((value for name, value in environ.items() if name.upper() == key), None)


# pydantic's error types, said as what was expected.
_EXPECTED = {
    "int_parsing": "an integer", "int_type": "an integer", "int_from_float": "an integer",
    "float_parsing": "a number", "float_type": "a number", "bool_parsing": "true or false",
    "bool_type": "true or false", "string_too_short": "a non-empty value", "list_type": "a JSON list",
    "path_type": "a path", "missing": "a value",
}


def _expected(error: Mapping[str, Any]) -> str:
    kind, ctx = error["type"], error.get("ctx") or {}
    bounds = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"),
              "less_than_equal": ("<=", "le"), "less_than": ("<", "lt")}
    if kind in bounds:
        op, key = bounds[kind]
        return f"a number {op} {ctx.get(key)}"
    if kind == "literal_error":
        return "one of " + str(ctx.get("expected", "")).replace("'", "")
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    return _EXPECTED.get(kind, str(error["msg"]).rstrip("."))


def _invalid(error: Mapping[str, Any], given: Mapping[str, Any], environ: Mapping[str, str]) -> str:
    loc = error.get("loc") or ("?",)
    field = str(loc[0])
    name = setting_name(field, given)
    where = name + "".join(f"[{part}]" for part in loc[1:])
    received = error.get("input")
    if field not in given:  # the variable's own text, not what pydantic made of it
        received = _env_value(field, environ) if _env_value(field, environ) is not None else received
    return f"{where}: expected {_expected(error)}, received {shown(received)}"


def _unparsed(exc: SettingsError, environ: Mapping[str, str]) -> str:
    match = re.search(r'field "(\w+)"', str(exc))
    field = match[1] if match else "?"
    example = '["my-policy=/path/to/checkpoint"]' if field == "checkpoints" else "a JSON list"
    return (f"{PREFIX}{field.upper()}: expected a JSON list such as {example}, "
            f"received {shown(_env_value(field, environ))}")


# --------------------------------------------------------------------------- the checks

def check_start(settings: Settings, given: Collection[str]) -> None:
    """Raise ``StartRefused`` with every reason this start cannot work (the cheap checks
    first; the session store is asked only when everything else is in order)."""
    lines = [*_extras(settings, given), *_paths(settings, given), *_grpc(settings, given)]
    if not lines and settings.session_store is not None:
        lines += _store(settings)
    if lines:
        raise StartRefused(lines)


def _extras(settings: Settings, given: Collection[str]) -> list[str]:
    lines = []
    if settings.session_store is not None and missing(("redis",)):
        lines.append(f"{setting_name('session_store', given)}: a session store needs the redis client library "
                     "(pip install 'rlserve[redis]'); received a store URL and no redis package")
    if settings.experience_log is not None and missing(EXPERIENCE_EXTRA):
        lines.append(f"{setting_name('experience_log', given)}: the experience log writes Parquet, which needs the "
                     "[experience] extra (pip install 'rlserve[experience]'); not installed: "
                     + ", ".join(missing(EXPERIENCE_EXTRA)))
    lacking = missing(TORCH_EXTRA) if settings.checkpoints else []
    if lacking:
        for spec in settings.checkpoints:
            if cached_export(spec, settings) is None:
                lines.append(
                    f"{setting_name('checkpoints', given)} {spec}: serving an RLlib checkpoint exports it, which "
                    f"needs the [torch] extra (pip install 'rlserve[torch]'); not installed: {', '.join(lacking)}. "
                    "Or export it where torch is (rlserve export CHECKPOINT --out DIR) and serve DIR with --repository")
    return lines


def _paths(settings: Settings, given: Collection[str]) -> list[str]:
    lines = []
    repo = settings.repository
    if repo is not None and not repo.is_dir():
        what = "a file" if repo.exists() else "nothing"
        lines.append(f"{setting_name('repository', given)}: expected a directory of bundles, received {str(repo)!r} "
                     f"({what} is there)")
    for spec in settings.checkpoints:
        path = parse_checkpoint_arg(spec)[1]
        why = (f"expected an RLlib checkpoint directory, received {str(path)!r} (nothing is there)"
               if not path.exists() else not_servable(path))
        if why is not None:
            lines.append(f"{setting_name('checkpoints', given)} {spec}: {why}")
    lines += _experience_folder(settings, given)
    for spec in settings.policy_sets:
        path = parse_checkpoint_arg(spec)[1]
        if not path.exists():
            lines.append(f"{setting_name('policy_sets', given)} {spec}: expected a policy set directory or a "
                         f"multi-policy RLlib checkpoint, received {str(path)!r} (nothing is there)")
    return lines


def _experience_folder(settings: Settings, given: Collection[str]) -> list[str]:
    """The experience log's folder must be a folder this server can write (made if missing):
    otherwise every row would be dropped from the first request on, with nothing said at start."""
    folder = settings.experience_log
    if folder is None:
        return []
    name = setting_name("experience_log", given)
    if folder.exists() and not folder.is_dir():
        return [f"{name}: expected a folder to write the experience log in, received {str(folder)!r} (a file is there)"]
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        return [f"{name}: expected a folder this server can write, received {str(folder)!r} "
                f"({str(existing)!r} is not writable)"]
    return []


def _grpc(settings: Settings, given: Collection[str]) -> list[str]:
    port = settings.grpc_port
    if port is None:
        return []
    name = setting_name("grpc_port", given)
    if missing(("grpc",)):
        return [f"{name}: the gRPC service needs grpcio (pip install 'rlserve[grpc]'); not installed"]
    if port == 0 and settings.workers > 1:
        return [f"{name} 0 would give each of the {settings.workers} workers its own port: expected one port "
                "number for all workers, received 0"]
    if port and port == settings.port:
        return [f"{name} {port} is the HTTP port too: expected a port of its own for gRPC (Triton uses 8001), "
                f"received {port}"]
    return []


def _store(settings: Settings) -> list[str]:
    """Ask the store for a PING, within its timeout."""
    import redis

    url = settings.session_store
    assert url is not None
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=settings.session_store_timeout_s,
                                      socket_timeout=settings.session_store_timeout_s)
        try:
            client.ping()
        finally:
            client.close()
    except (redis.exceptions.RedisError, OSError, ValueError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        return [f"{PREFIX}SESSION_STORE: expected a Redis or Valkey server answering at {redacted(url)}, "
                f"received {type(exc).__name__}: {reason}"]
    return []


def listening_socket(settings: Settings, given: Collection[str]) -> socket.socket:
    """The HTTP port, bound now, before any model loads (uvicorn, or the workers, serve on
    it): a port another program holds is a refusal in one line, not an error after every
    model has loaded (minutes, for checkpoints to export)."""
    host, port = settings.host, settings.port
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds it
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        reason = exc.strerror or type(exc).__name__
        if exc.errno == errno.EADDRINUSE:
            line = (f"{setting_name('port', given)}: expected a port no other program listens on at {host}, "
                    f"received {port} ({reason}: stop that program, or choose another port)")
        else:
            line = (f"{setting_name('host', given)}: expected an address of this machine to listen on, "
                    f"received {shown(host)} ({reason})")
        raise StartRefused([line]) from None
    sock.set_inheritable(True)  # --workers: each worker process serves it
    return sock
