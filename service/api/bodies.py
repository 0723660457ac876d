"""Reading the small JSON bodies of the non-act routes (sessions, admin load) safely.

The act routes decode with msgspec (``rlserve.service.act.wire``); these routes parse with the standard
library and validate with pydantic, and every way that can fail becomes the project's
error JSON: 413 ``payload_too_large`` past the limit, 400 ``invalid_json`` for a body that
is not JSON (invalid UTF-8, NaN tokens, nesting past the recursion limit, integers over
Python's 4300-digit limit), 400 ``bad_request`` naming the field otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from rlserve.service.act.body import read_body as read_asgi_body
from rlserve.service.errors import BadRequest, InvalidJSON

M = TypeVar("M", bound=BaseModel)

# Leading ``loc`` entries that say where a parameter came from rather than which it is.
_LOCATIONS = {"body", "query", "path", "header", "cookie"}


def body_limit(request: Request) -> int:
    # One documented bound for every route: RLSERVE_MAX_BODY_BYTES, as on the act route.
    return request.app.state.settings.max_body_bytes


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body of a routed request, with the one bound every route shares."""
    return await read_asgi_body(request.receive, limit, declared=request.headers.get("content-length"))


def _reject_constant(token: str) -> Any:
    raise ValueError(f"{token} is not valid JSON (non-finite numbers are not allowed)")


def parse_json(raw: bytes) -> Any:
    """``raw`` as JSON (strict UTF-8, no NaN/Infinity tokens); 400 ``invalid_json`` if not."""
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError as exc:
        raise InvalidJSON(f"request body is not valid UTF-8: {exc.reason} at byte {exc.start}",
                          expected="a JSON object in UTF-8", received=_snippet(raw)) from None
    except RecursionError:
        raise InvalidJSON("request body nests deeper than the parser allows",
                          expected="a JSON object", received=_snippet(raw)) from None
    except ValueError as exc:  # JSONDecodeError, NaN tokens, integers over 4300 digits
        raise InvalidJSON(f"request body is not valid JSON: {exc}", expected="a JSON object",
                          received=_snippet(raw)) from None


def validate(model: type[M], data: Any) -> M:
    """``data`` as ``model``; 400 ``bad_request`` naming the first offending field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise bad_request(exc.errors(include_url=False), allowed=list(model.model_fields), located=False) from None


async def read_model(request: Request, model: type[M], *, empty: M | None = None) -> M:
    """Read, parse and validate a JSON body as ``model``; an empty body gives ``empty``
    when that is given (every field optional), else it is invalid JSON."""
    raw = await read_body(request, body_limit(request))
    if empty is not None and not raw.strip():
        return empty
    return validate(model, parse_json(raw))


def bad_request(errors: Sequence[Any], allowed: list[str] | None = None, *, located: bool = True) -> BadRequest:
    """The project's 400 for the first of pydantic's (or, ``located``, FastAPI's: their
    ``loc`` starts with where the parameter came from) validation errors."""
    first = dict(errors[0]) if errors else {}
    field = field_path(first.get("loc", ()), located)
    expected = _expected(first, allowed)
    message = first.get("msg", "validation failed")
    if first.get("type") == "value_error":  # pydantic's "Value error, <ours>" reads badly
        message = f"expected {expected}"
    return BadRequest(f"{field or 'body'}: {message}", field=field, expected=expected,
                      received=_received(first.get("input")))


def field_path(loc: Sequence[Any], located: bool = False) -> str | None:
    """pydantic's ``loc`` as a dotted path with list indices: ``('a', 0, 'b')`` -> ``a[0].b``;
    ``located`` drops FastAPI's leading location (``('body', 'a')`` -> ``a``)."""
    parts = list(loc)
    if located and parts and parts[0] in _LOCATIONS:
        parts = parts[1:]
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or None


_EXPECTED = {
    "missing": "a value (the field is required)",
    "string_type": "a string",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "int_parsing": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean",
    "finite_number": "a finite number",
    "model_type": "a JSON object",
    "model_attributes_type": "a JSON object",
    "dict_type": "a JSON object",
    "list_type": "a list",
    "json_invalid": "valid JSON",
    "string_unicode": "valid Unicode text (no lone surrogate escapes)",
}
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def _expected(error: dict[str, Any], allowed: list[str] | None) -> Any:
    kind, ctx = error.get("type", ""), error.get("ctx") or {}
    if kind == "extra_forbidden":
        return {"one_of": allowed} if allowed is not None else "no field of this name"
    if kind in _BOUNDS:
        bound = next(iter(ctx.values()), None)
        return f"a number {_BOUNDS[kind]} {bound}"
    if kind in ("string_too_short", "too_short"):
        return f"a string of at least {ctx.get('min_length')} characters"
    if kind in ("string_too_long", "too_long"):
        return f"a string of at most {ctx.get('max_length')} characters"
    if kind == "value_error" and "error" in ctx:
        return str(ctx["error"])
    if kind in _EXPECTED:
        return _EXPECTED[kind]
    message = str(error.get("msg", ""))
    return message.removeprefix("Input should be ") or None


def _received(value: Any) -> Any:
    """The offending value, shortened: long strings and containers by their size."""
    if isinstance(value, str) and len(value) > 200:
        return f"a string of {len(value)} characters"
    if isinstance(value, list | dict) and len(value) > 16:
        return f"a {'list' if isinstance(value, list) else 'JSON object'} of {len(value)} items"
    return value  # ServiceError.to_json makes whatever is left encodable


def _snippet(raw: bytes) -> str:
    text = raw[:60].decode("utf-8", "backslashreplace")
    return text + ("..." if len(raw) > 60 else "")
