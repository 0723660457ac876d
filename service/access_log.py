"""The access log: one line per answered request (``RLSERVE_ACCESS_LOG``).

Each line holds the method, the route's template (``/v1/models/{name}/act``: never the raw
path, whose ids are client data), the status, the latency, the model and the rows of an
act or infer request; never a body. ``refused`` (the default) writes the answers with a
status of 400 or more only: a refused request always leaves a line, while the answered
steps of a busy server cost nothing but a clock read. ``all`` writes every answer, ``off``
none. Text lines by default; ``RLSERVE_ACCESS_LOG_FORMAT=json`` writes one JSON object a line.

Three transports answer requests, and each records its own: the act protocol
(``act/protocol.py``, no ASGI), the raw ASGI handler and FastAPI's routes (``access_asgi``
around the whole app). The rows of a request are learnt where it is validated
(``ActService._accept``), through ``current_note``: a context variable the transport sets
around the synchronous call into the service, so nothing is passed through the routes.

Lines go to the logger ``rlserve.access`` with a handler of their own on stderr: they are
written whatever ``RLSERVE_LOG_LEVEL`` says (the setting above decides).
"""

from __future__ import annotations

import logging
import re
import sys
import time
from contextvars import ContextVar
from typing import Any

import msgspec

ACCESS_KEY = "rlserve.access"  # an ASGI scope's AccessNote
MAX_NAME = 64  # a longer model name from a URL is logged by its length (client data)
_ENCODE = msgspec.json.Encoder().encode


class AccessNote:
    """What the transport and the service learn about one request on its way."""

    __slots__ = ("started", "match", "rows")

    def __init__(self, started: float, match: re.Match[str] | None = None):
        self.started = started
        self.match = match  # a fast route's path match (template and model come from it)
        self.rows: int | None = None


# The request being validated right now (set by a transport around its call into the service).
current_note: ContextVar[AccessNote | None] = ContextVar("rlserve_access_note", default=None)


def note_rows(rows: int) -> None:
    """Record the rows of the request being accepted (``ActService._accept``)."""
    note = current_note.get()
    if note is not None:
        note.rows = rows


class AccessLog:
    def __init__(self, mode: str, fmt: str = "text", stream: Any = None):
        self.mode = mode
        self.refused_only = mode == "refused"
        self.json = fmt == "json"
        self.logger = logging.getLogger("rlserve.access")
        if mode != "off":
            handler = logging.StreamHandler(stream or sys.stderr)
            handler.setFormatter(logging.Formatter("%(message)s" if self.json else "%(asctime)s ACCESS %(message)s"))
            for old in self.logger.handlers[:]:  # an earlier app of this process (tests): the last one's format
                self.logger.removeHandler(old)
            self.logger.addHandler(handler)
            self.logger.setLevel(logging.INFO)
            self.logger.propagate = False  # its own handler; the log level does not silence it

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    def note(self, match: re.Match[str] | None = None) -> AccessNote:
        return AccessNote(time.perf_counter(), match)

    def record(self, method: str, route: str, status: int, note: AccessNote, model: str | None = None) -> None:
        """Write the line of an answered request (unless ``refused`` and it was not refused)."""
        if self.refused_only and status < 400:
            return
        latency_ms = round((time.perf_counter() - note.started) * 1e3, 3)
        if model is None and note.match is not None:
            model = note.match.groupdict().get("name")
        shown = None if model is None else client_text(model)
        if self.json:
            line = _ENCODE({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "method": method, "route": route,
                            "status": status, "latency_ms": latency_ms, "model": shown, "rows": note.rows}).decode()
        else:
            rows = "-" if note.rows is None else note.rows
            line = f"{method} {route} {status} {latency_ms}ms model={shown or '-'} rows={rows}"
        self.logger.info(line)

    def record_fast(self, method: str, path: str, status: int, note: AccessNote) -> None:
        """``record`` for a fast route (act, infer): the template from its path match."""
        self.record(method, template(path, note.match), status, note)


def template(path: str, match: re.Match[str] | None) -> str:
    """``path`` with each named group of ``match`` (the route's parameters) as ``{name}``."""
    if match is None:
        return "(no route)"
    out, last = [], 0
    for name in match.re.groupindex:
        start, end = match.span(name)
        if start < 0:
            continue  # an optional part (a version) the path does not have
        out += [path[last:start], "{" + name + "}"]
        last = end
    return "".join(out) + path[last:]


def client_text(text: str) -> str:
    """A client's string as a log line may hold it: short, on one line."""
    if len(text) > MAX_NAME:
        return f"<{len(text)} characters>"
    return text if text.isprintable() and " " not in text else msgspec.json.encode(text).decode()


# --------------------------------------------------------------------------- ASGI

def access_asgi(app: Any, log: AccessLog) -> Any:
    """``app`` with a line logged for every HTTP request it answers (FastAPI's routes and
    the raw ASGI handler; the act protocol records its own)."""

    async def logged(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        note = log.note()
        scope[ACCESS_KEY] = note
        status = 500  # what the client gets if the app raises before it answers

        async def send_seen(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        token = current_note.set(note)
        try:
            await app(scope, receive, send_seen)
        finally:
            current_note.reset(token)
            log.record(scope["method"], _route_of(scope, note), status, note, _model_of(scope, note))

    return logged


def _route_of(scope: dict[str, Any], note: AccessNote) -> str:
    if note.match is not None:  # a fast route of the raw handler
        return template(scope["path"], note.match)
    route = scope.get("route")  # FastAPI's matched route; path_format drops converters (":path")
    return getattr(route, "path_format", None) or getattr(route, "path", None) or "(no route)"


def _model_of(scope: dict[str, Any], note: AccessNote) -> str | None:
    if note.match is not None:
        return None  # record() takes it from the match
    params = scope.get("path_params") or {}
    name = params.get("name")
    return name if isinstance(name, str) else None
