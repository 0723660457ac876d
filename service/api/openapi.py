"""What the OpenAPI document says beyond what FastAPI infers from the routes.

Every error a route can answer is documented with its status and the one error body
(``ErrorResponse``): routers pass ``errors(...)`` as their ``responses``. FastAPI's own
422 entries (``HTTPValidationError``) are dropped from the document: its validation
errors never leave this app, they answer the project's 400 (``rlserve.service.app``).
"""

from __future__ import annotations

from typing import Any

ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}

# The default description of each error status; a route may say more precisely why.
WHY: dict[int, str] = {
    400: "Malformed request (invalid JSON, wrong field type or value): the error names the field, "
         "what was expected and what was received",
    401: "No 'Authorization: Bearer <token>' header",
    403: "Wrong admin token",
    404: "Unknown model, version or session",
    409: "Conflict with the current state",
    410: "Session expired, ended or its version unloaded",
    413: "Request body larger than RLSERVE_MAX_BODY_BYTES",
    422: "Well-formed request that the model cannot take",
    500: "Internal error",
    503: "Not ready or queue full (see Retry-After)",
}

_FASTAPI_VALIDATION = "#/components/schemas/HTTPValidationError"


def errors(*codes: int, **why: str) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries for error ``codes``, all with the ``ErrorResponse`` body;
    ``why`` overrides a description by status (``e404="Unknown model"``)."""
    return {code: {"description": why.get(f"e{code}", WHY[code]),
                   "content": {"application/json": {"schema": ERROR_REF}}} for code in codes}


def body_schema(model: Any) -> dict[str, Any]:
    """A pydantic body model's JSON schema with its nested models written in place: a route's
    ``openapi_extra`` is copied into the document as it is, where a ``#/$defs/...``
    reference would point at nothing."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(defs[ref.removeprefix("#/$defs/")])
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(value) for value in node]
        return node

    return inline(schema)


def drop_fastapi_validation_errors(schema: dict[str, Any]) -> None:
    """Remove the 422 ``HTTPValidationError`` FastAPI adds to routes with parameters (this
    app answers its validation errors with 400 ``ErrorResponse``), and its schemas."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {}) if isinstance(operation, dict) else {}
            content = responses.get("422", {}).get("content", {}).get("application/json", {})
            if content.get("schema", {}).get("$ref") == _FASTAPI_VALIDATION:
                del responses["422"]
    components = schema.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
