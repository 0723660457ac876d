"""Typed service errors and their one JSON shape.

Every error leaving the server is ``{"error": {"code", "message", "field", "expected",
"received"}}``. Handlers raise a ``ServiceError`` subclass; the API layer maps it to its
HTTP status. This module is framework-free so the raw ASGI act path can use it too.
"""

from __future__ import annotations

from typing import Any

import msgspec


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
        return {
            "error": {
                "code": self.code,
                "message": self.message,
                "field": self.field,
                "expected": _jsonable(self.expected),
                "received": _jsonable(self.received),
            }
        }

    def body(self) -> bytes:
        return msgspec.json.encode(self.to_json())


def _jsonable(value: Any) -> Any:
    """Describe a value for the error payload without risking a second failure."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple | dict):
        try:
            msgspec.json.encode(value)
            return value
        except (TypeError, ValueError, OverflowError):
            pass
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


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


class VersionConflict(ServiceError):
    status, code = 409, "version_conflict"


class SessionExpired(ServiceError):
    status, code = 410, "session_expired"


class PayloadTooLarge(ServiceError):
    status, code = 413, "payload_too_large"


class InvalidInput(ServiceError):
    """The request is well-formed JSON but does not fit the model's spaces."""

    status, code = 422, "invalid_input"


class AllActionsMasked(ServiceError):
    status, code = 422, "all_actions_masked"


class BundleInvalid(ServiceError):
    status, code = 422, "bundle_invalid"


class QueueFull(ServiceError):
    status, code = 503, "queue_full"


class NotReady(ServiceError):
    status, code = 503, "not_ready"


class InternalError(ServiceError):
    status, code = 500, "internal_error"


class BatchFailed(ServiceError):
    """The runtime call of a batch raised; only that batch's requests see this."""

    status, code = 500, "batch_failed"
