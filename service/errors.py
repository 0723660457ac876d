"""Typed service errors and their one JSON shape.

Every error leaving the server is ``{"error": {"code", "message", "field", "expected",
"received"}}``. Handlers raise a ``ServiceError`` subclass; the API layer maps it to its
HTTP status. This module is framework-free so the raw ASGI act path can use it too.

It also owns the rule for a client's text in what the server says back or logs: a string
longer than ``MAX_ECHO`` characters (a session id, an unknown key, a model name, a header
value) is reported by its length, never echoed. Messages quote client values through
``quoted``; ``to_json`` applies the rule to every part of an error once more (``bounded``
for text the server wrote around a client's, ``_jsonable`` for what was received), and
``BoundedLogLines`` to log records and their tracebacks. An error body stays a few KiB
and a log line bounded, whatever was sent.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

# Client text longer than this is described by its length (the Open Inference Protocol's
# names are up to 256 characters: every legal one is still quoted).
MAX_ECHO = 256
MAX_MESSAGE = 2048  # a message (or a log line) longer than this is cut, saying how long it was
MAX_TRACEBACK = 16384
_LONG_RUN = re.compile(rf"\S{{{MAX_ECHO + 1},}}")


def quoted(value: object) -> str:
    """``value`` as a message quotes it: its ``repr``, or what it is and its length when
    that would be longer than ``MAX_ECHO`` characters (a client's value, never echoed)."""
    if isinstance(value, str | bytes | list | tuple | dict | set | frozenset) and len(value) > MAX_ECHO:
        unit = "characters" if isinstance(value, str) else "bytes" if isinstance(value, bytes) else "items"
        return f"<{type(value).__name__} of {len(value)} {unit}>"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a repr that fails (recursion, int digits) must not escape
        return f"<{type(value).__name__}>"
    return text if len(text) <= MAX_ECHO else f"<{type(value).__name__} of {len(text)} characters as text>"


def bounded(text: str, limit: int = MAX_MESSAGE) -> str:
    """Text the server wrote that may hold a client's (a message, a log line): every run of
    more than ``MAX_ECHO`` non-blank characters becomes its length, and the whole is cut at
    ``limit`` characters, saying how long it was."""
    if len(text) <= MAX_ECHO:
        return text
    text = _LONG_RUN.sub(lambda run: f"<{len(run[0])} characters>", text)
    if len(text) > limit:
        text = f"{text[:limit - 48]} ... <cut: {len(text)} characters in all>"
    return text


class ServiceError(Exception):
    """Base of every error the API reports to a client."""

    status: int = 500
    code: str = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        expected: Any = None,
        received: Any = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.field = field
        self.expected = expected
        self.received = received
        self.headers = headers or {}

    def to_json(self) -> dict[str, Any]:
        # Every part is made encodable: an error must never fail to be reported (a received
        # inf, a lone surrogate or a 5000-digit integer would make the JSON encoder raise),
        # and small: a client's long text is described by its length (``MAX_ECHO``).
        longs = _long_strings((self.field, self.received), [])  # the client's, quoted whole
        expected = _Describe(_EXPECTED.items, lambda text: bounded(_strip(text, longs)))
        return {
            "error": {
                "code": self.code,
                "message": _text(bounded(_strip(self.message, longs))),
                "field": None if self.field is None else _text(bounded(_strip(self.field, longs), MAX_ECHO)),
                "expected": _jsonable(self.expected, expected),
                "received": _jsonable(self.received, _RECEIVED),
            }
        }

    def body(self) -> bytes:
        return msgspec.json.encode(self.to_json())


_MAX_DEPTH = 8  # deeper parts of a received value are described by a short repr
_MAX_INT_BITS = 1024  # larger integers cannot be written as JSON by every encoder


@dataclass(frozen=True, slots=True)
class _Describe:
    """How ``_jsonable`` shortens a part: its longest list, and its strings."""

    items: int
    text: Callable[[str], str]


def _long_string(value: str) -> str:
    return value if len(value) <= MAX_ECHO else f"a string of {len(value)} characters"


# ``received`` is the client's: a long string is only its length. ``expected`` is the
# server's, which may quote a client's value: the rule for text the server wrote.
_RECEIVED = _Describe(32, _long_string)
_EXPECTED = _Describe(256, bounded)


def _jsonable(value: Any, describe: _Describe, depth: int = 0) -> Any:
    """Describe a value for the error payload without risking a second failure.

    Strict-JSON safe: non-finite floats become strings ("inf"), strings that are not valid
    Unicode get their bad characters escaped, huge integers and deep or unknown values a
    short text. Small: long strings and containers of more than ``describe.items``
    entries are described by their length.
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if value.bit_length() <= _MAX_INT_BITS else f"an integer of {value.bit_length()} bits"
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        return _text(describe.text(value))
    if isinstance(value, list | tuple | dict) and len(value) > describe.items:
        return f"{'an object' if isinstance(value, dict) else 'a list'} of {len(value)} items"
    if depth < _MAX_DEPTH and isinstance(value, list | tuple):
        return [_jsonable(v, describe, depth + 1) for v in value]
    if depth < _MAX_DEPTH and isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {_key(k, i): _jsonable(v, describe, depth + 1) for i, (k, v) in enumerate(value.items())}
    return _text(quoted(value))


def _long_strings(value: Any, found: list[str], depth: int = 0) -> list[str]:
    """The strings longer than ``MAX_ECHO`` in ``value`` (keys too; a few levels deep)."""
    if isinstance(value, str):
        if len(value) > MAX_ECHO:
            found.append(value)
    elif depth < 3 and isinstance(value, list | tuple):
        for item in value[:_RECEIVED.items]:
            _long_strings(item, found, depth + 1)
    elif depth < 3 and isinstance(value, dict):
        for key, item in list(value.items())[:_RECEIVED.items]:
            _long_strings(key, found, depth + 1)
            _long_strings(item, found, depth + 1)
    return found


def without(message: str, values: Any) -> str:
    """``message`` with each long client string of ``values`` (an error's field and what it
    received, a log line's arguments) replaced by its length: a library's message
    (msgspec's, pydantic's, a distribution's) quotes the value whole."""
    return _strip(message, _long_strings(values, [])) if len(message) > MAX_ECHO else message


def _strip(message: str, longs: list[str]) -> str:
    for value in longs:
        if len(message) <= MAX_ECHO:
            break
        described = f"<{len(value)} characters>"
        message = message.replace(repr(value), described).replace(value, described)
    return message


def _key(key: str, index: int) -> str:
    return _text(key) if len(key) <= MAX_ECHO else f"<key {index}: {len(key)} characters>"


def _text(value: str) -> str:
    """``value`` with anything UTF-8 cannot encode (lone surrogates) backslash-escaped."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")


class BadRequest(ServiceError):
    status, code = 400, "bad_request"


class InvalidJSON(ServiceError):
    status, code = 400, "invalid_json"


class PathOutsideRepository(ServiceError):
    status, code = 400, "path_outside_repository"


class Unauthorized(ServiceError):
    status, code = 401, "unauthorized"


class Forbidden(ServiceError):
    status, code = 403, "forbidden"


class MethodNotAllowed(ServiceError):
    status, code = 405, "method_not_allowed"


class NotFound(ServiceError):
    status, code = 404, "not_found"


class ModelNotFound(ServiceError):
    status, code = 404, "model_not_found"


class SessionNotFound(ServiceError):
    status, code = 404, "session_not_found"


class AdminDisabled(ServiceError):
    status, code = 404, "admin_disabled"


class SessionConflict(ServiceError):
    status, code = 409, "session_conflict"


class SessionBusy(SessionConflict):
    """The 409 a retry may clear: the session changed elsewhere while the step ran, or has
    a request in flight. Other conflicts (a step index or version that does not fit, an id
    already live) stay until the client changes the request; gRPC tells them apart."""


class VersionConflict(ServiceError):
    status, code = 409, "version_conflict"


class SessionExpired(ServiceError):
    status, code = 410, "session_expired"


class PayloadTooLarge(ServiceError):
    status, code = 413, "payload_too_large"


class InvalidInput(ServiceError):
    """The request is well-formed JSON but does not fit the model's spaces."""

    status, code = 422, "invalid_input"


class NoTraffic(ServiceError):
    """Traffic weights each valid that leave no version any traffic (they sum to 0)."""

    status, code = 422, "no_traffic"


class AllActionsMasked(ServiceError):
    status, code = 422, "all_actions_masked"


class BundleInvalid(ServiceError):
    status, code = 422, "bundle_invalid"


class QueueFull(ServiceError):
    status, code = 503, "queue_full"


class NotReady(ServiceError):
    status, code = 503, "not_ready"


class SessionsUnavailable(ServiceError):
    """Sessions cannot be created in this configuration (several workers, no shared store)."""

    status, code = 503, "sessions_unavailable"


class StoreUnavailable(ServiceError):
    """The external session store did not answer; nothing was answered from a guess."""

    status, code = 503, "session_store_unavailable"


class InternalError(ServiceError):
    status, code = 500, "internal_error"


def as_service_error(exc: Exception, log: logging.Logger, what: str) -> ServiceError:
    """``exc`` itself when it is meant for the client; any other exception is a bug: it is
    logged with its traceback and the client gets a 500 naming only its type."""
    if isinstance(exc, ServiceError):
        return exc
    log.error("%s", what, exc_info=exc)
    return InternalError(f"internal error: {type(exc).__name__}")


class BatchFailed(ServiceError):
    """The runtime call of a batch raised; only that batch's requests see this."""

    status, code = 500, "batch_failed"


class ErrorCounter(Protocol):
    def error(self, code: str, status: int) -> None: ...


def error_reply(exc: ServiceError, counter: ErrorCounter | None = None) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """The one mapping of an error to a response: (status, JSON body, headers besides
    content-type), counted in the error metrics. Every route and both act paths use it."""
    if counter is not None:
        counter.error(exc.code, exc.status)
    return exc.status, exc.body(), [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in exc.headers.items()]


def body_too_large(size: int, limit: int) -> PayloadTooLarge:
    """The 413 for a body (or its declared length) past ``limit`` bytes."""
    return PayloadTooLarge(f"request body exceeds {limit} bytes", expected=limit, received=size)


def summarize_received(value: Any) -> Any:
    """A short description of a received value for an error's ``received`` field."""
    if isinstance(value, list):
        return f"list of length {len(value)}"
    if isinstance(value, dict):
        keys = sorted(value, key=str)[:10]
        return f"object with keys [{', '.join(quoted(k) for k in keys)}]"
    if isinstance(value, str) and len(value) > 40:
        return f"string of length {len(value)}"
    return value


class BoundedLogLines(logging.Filter):
    """The same rule for log records: a message (arguments included) and a traceback are
    ``bounded``, so a client's multi-megabyte string is logged by its length."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if len(message) > MAX_ECHO:
            record.msg, record.args = bounded(without(message, record.args)), None
        if record.exc_info and not record.exc_text:
            error = record.exc_info[1]
            text = logging.Formatter().formatException(record.exc_info)
            record.exc_text = bounded(without(text, error.args if error is not None else ()), MAX_TRACEBACK)
        return True


def bound_log_lines(*loggers: str) -> None:
    """Put ``BoundedLogLines`` on every handler of the root logger and of ``loggers``
    (uvicorn's have handlers of their own); calling it again adds nothing."""
    for name in ("", *loggers):
        for handler in logging.getLogger(name or None).handlers:
            if not any(isinstance(f, BoundedLogLines) for f in handler.filters):
                handler.addFilter(BoundedLogLines())
