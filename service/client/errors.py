"""The client's typed errors: one class per kind of refusal the service answers.

Every error answer of rlserve is ``{"error": {"code", "message", "field", "expected",
"received"}}``; the client raises the class of its ``code`` (or, for codes it has no class
for, of its HTTP status), with those fields as attributes. Catch ``RLServeError`` for all.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

# Retry-After in seconds, ASCII only: str.isdigit() takes '²', which float() refuses.
_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")

__all__ = [
    "AllActionsMaskedError",
    "AuthError",
    "BadRequestError",
    "ConflictError",
    "ConnectionFailed",
    "InvalidInputError",
    "ModelNotFoundError",
    "NotFoundError",
    "OverloadedError",
    "RLServeError",
    "ServerError",
    "SessionExpiredError",
    "SessionNotFoundError",
    "error_from_payload",
    "error_from_response",
]


class RLServeError(Exception):
    """An error answer from the service, or no answer at all (``status`` 0).

    Attributes mirror the service's error body: ``status`` (HTTP), ``code`` (e.g.
    ``"invalid_input"``), ``message``, ``field`` (the dotted path of the offending field, or
    None), ``expected`` and ``received``; ``retry_after`` holds the seconds of a
    ``Retry-After`` header (503 answers), else None.
    """

    status: int = 0
    code: str = "error"
    tag: str | int | None = None  # a stream's error frame: the tag of the message it refused

    def __init__(self, message: str, *, status: int = 0, code: str | None = None,
                 field: str | None = None, expected: Any = None, received: Any = None,
                 retry_after: float | None = None):
        """``message`` and the fields of the service's error body; ``status`` and ``code``
        default to the class's."""
        super().__init__(message)
        self.message = message
        self.status = status or type(self).status
        self.code = code or type(self).code
        self.field = field
        self.expected = expected
        self.received = received
        self.retry_after = retry_after

    def __str__(self) -> str:
        where = f" (field {self.field!r})" if self.field else ""
        return f"[{self.status} {self.code}]{where} {self.message}"


class BadRequestError(RLServeError):
    """400: the request is malformed (unknown field, wrong type, not JSON)."""

    status, code = 400, "bad_request"


class AuthError(RLServeError):
    """401/403: the admin API's bearer token is missing or wrong."""

    status, code = 401, "unauthorized"


class NotFoundError(RLServeError):
    """404: an unknown route, model, version or session."""

    status, code = 404, "not_found"


class ModelNotFoundError(NotFoundError):
    """404 ``model_not_found``: no such model (or version) is loaded."""

    code = "model_not_found"


class SessionNotFoundError(NotFoundError):
    """404 ``session_not_found``: the session id was never created (or this client did not
    start the episode it names)."""

    code = "session_not_found"


class ConflictError(RLServeError):
    """409: the session is bound to another version, changed elsewhere, or already exists."""

    status, code = 409, "conflict"


class SessionExpiredError(RLServeError):
    """410 ``session_expired``: the session ended, expired, was evicted or its version unloaded."""

    status, code = 410, "session_expired"


class InvalidInputError(RLServeError):
    """422 ``invalid_input``: the observation (or mask, or action) does not fit the model's spaces."""

    status, code = 422, "invalid_input"


class AllActionsMaskedError(InvalidInputError):
    """422 ``all_actions_masked``: the action mask allows no action."""

    code = "all_actions_masked"


class OverloadedError(RLServeError):
    """503: the model's queue is full (``queue_full``, retried by the client) or the server
    is not ready or cannot reach its session store."""

    status, code = 503, "queue_full"


class ServerError(RLServeError):
    """5xx: the server failed on this request (``batch_failed``, ``internal_error``)."""

    status, code = 500, "internal_error"


class ConnectionFailed(RLServeError):
    """No answer: the server could not be reached, or an act request timed out after it was sent."""

    status, code = 0, "connection_failed"


_BY_CODE: dict[str, type[RLServeError]] = {
    "model_not_found": ModelNotFoundError,
    "session_not_found": SessionNotFoundError,
    "session_expired": SessionExpiredError,
    "all_actions_masked": AllActionsMaskedError,
    "queue_full": OverloadedError,
}
_BY_STATUS: dict[int, type[RLServeError]] = {
    400: BadRequestError, 401: AuthError, 403: AuthError, 404: NotFoundError,
    409: ConflictError, 410: SessionExpiredError, 422: InvalidInputError, 503: OverloadedError,
}


def error_from_response(response: httpx.Response) -> RLServeError:
    """The typed error for a non-2xx answer (by its ``code``, else its HTTP status)."""
    try:
        payload = response.json()
    except ValueError:
        payload = {}
    retry_after = response.headers.get("retry-after")
    return error_from_payload(payload, response.status_code,
                              response.text[:200] or response.reason_phrase,
                              float(retry_after) if retry_after and _SECONDS.fullmatch(retry_after) else None)


def error_from_payload(payload: Any, status: int, fallback: str = "", retry_after: float | None = None) -> RLServeError:
    """The typed error of an error body ``{"error": {...}}`` answered with ``status`` (an
    HTTP answer's, or a stream's error frame, which carries its status)."""
    try:
        body = payload.get("error", {})
        body.get("code")
    except AttributeError:
        body = {}
    code = body.get("code") or f"http_{status}"
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else RLServeError
    return cls(
        body.get("message") or fallback or f"status {status}",
        status=status,
        code=code,
        field=body.get("field"),
        expected=body.get("expected"),
        received=body.get("received"),
        retry_after=retry_after,
    )
