"""The act routes: a raw ASGI hot path plus the FastAPI routes that document it.

FastAPI's routing, dependency and response machinery costs ~200 us per request, more
than a small policy's whole step. ``RawActHandler`` answers ``POST /v1/models/{name}/act``
and ``POST /v1/models/{name}/versions/{version}/act`` straight from the ASGI scope with
msgspec; the app dispatches to it before FastAPI's router. The FastAPI routes below are
the same endpoints for OpenAPI (and serve them when the hot path is turned off); both
call ``ActService.act``.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import msgspec
from fastapi import APIRouter, Request, Response

from service.acting import ActService
from service.api.bodies import body_limit, read_body
from service.api.openapi import errors
from service.errors import PayloadTooLarge, ServiceError, as_service_error
from service.metrics import Metrics
from service.sessions import MAX_SESSION_ID_LENGTH
from service.wire import ActRequest, ActResponse, schema_hook

log = logging.getLogger("rlserve.api")

ACT_PATH = re.compile(r"^/v1/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/act$")
_JSON_HEADERS = [(b"content-type", b"application/json")]


class RawActHandler:
    """ASGI callable for the act routes; ``match(scope)`` says whether it applies."""

    def __init__(self, service: ActService, metrics: Metrics | None, max_body_bytes: int):
        self.service = service
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes

    @staticmethod
    def match(scope: dict[str, Any]) -> re.Match[str] | None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return None
        path = scope["path"]
        if not path.endswith("/act"):
            return None
        return ACT_PATH.match(path)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any, match: re.Match[str]) -> None:
        try:
            message = await receive()
            body = message.get("body", b"")
            if message.get("more_body", False) or len(body) > self.max_body_bytes:
                body = await self._read_rest(receive, message, body)
            payload = await self.service.act(match["name"], match["version"], body)
            status, headers = 200, _JSON_HEADERS
        except Exception as exc:  # never let one request take the worker down
            status, payload, extra = error_response(as_service_error(exc, log, "act failed"), self.metrics)
            headers = _JSON_HEADERS + extra
        headers = [*headers, (b"content-length", b"%d" % len(payload))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def _read_rest(self, receive: Any, message: dict[str, Any], body: bytes) -> bytes:
        """The rest of a body that came in several messages (or the first one was too big)."""
        chunks = [body]
        size = len(body)
        while True:
            if size > self.max_body_bytes:
                raise PayloadTooLarge(f"request body exceeds {self.max_body_bytes} bytes",
                                      expected=self.max_body_bytes, received=size)
            if not message.get("more_body", False):
                return b"".join(chunks)
            message = await receive()
            chunk = message.get("body", b"")
            size += len(chunk)
            chunks.append(chunk)



def error_response(exc: ServiceError, metrics: Metrics | None) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """(status, JSON body, headers besides content-type) for a refused act request,
    counted in the error metrics. Shared with ``service.act_protocol``."""
    if metrics is not None:
        metrics.error(exc.code, exc.status)
    return exc.status, exc.body(), [(k.lower().encode(), v.encode()) for k, v in exc.headers.items()]


# --------------------------------------------------------------------------- documented routes

def _schemas() -> tuple[dict[str, Any], dict[str, Any]]:
    (request, response), components = msgspec.json.schema_components(
        [ActRequest, ActResponse], schema_hook=schema_hook, ref_template="#/components/schemas/{name}")
    _state_the_forms(components["ActRequest"])
    return {"request": request, "response": response}, components


# The per-row fields of the batch form, each the plural of its single-form field.
_COLUMNS = ("session_ids", "episode_starts", "rewards", "prev_actions", "action_masks", "seeds")


def _state_the_forms(schema: dict[str, Any]) -> None:
    """Add to ``ActRequest``'s schema what ``wire.to_rows`` and the session lookup enforce
    beyond the field types: exactly one of ``observation`` / ``observations`` (a non-empty
    list), each form's fields only with it, session ids of 1..128 characters. (That each
    column has one entry per observation, and a session appears once per request, JSON
    Schema cannot say; the field descriptions do.)"""
    fields = schema["properties"]
    assert all(c in fields and c[:-1] in fields for c in _COLUMNS), "ActRequest fields changed"
    null = {"type": "null"}
    ids = [fields["session_id"], *[s["items"] for s in fields["session_ids"]["anyOf"] if s.get("type") == "array"]]
    for string in [s for field in ids for s in field["anyOf"] if s.get("type") == "string"]:
        string.update(minLength=1, maxLength=MAX_SESSION_ID_LENGTH)
    fields["observations"]["minItems"] = 1
    for column in _COLUMNS:
        fields[column]["description"] = (f"Batch form: one entry per observation (the list is as long as "
                                         f"'observations'); with 'observation' use '{column[:-1]}'")
    fields["session_ids"]["description"] += "; each session at most once per request"
    single_defaults = {"session_id": null, "episode_start": {"const": False}, "reward": null,
                       "action_mask": null, "seed": null}
    schema["oneOf"] = [
        {"title": "single", "description": "One row: 'observation' and the single-form fields",
         "required": ["observation"], "not": {"required": ["observations"]},
         "properties": {column: null for column in _COLUMNS}},
        {"title": "batch", "description": "A list of rows: 'observations' and the batch-form fields",
         "required": ["observations"],
         "not": {"anyOf": [{"required": ["observation"]}, {"required": ["prev_action"]}]},
         "properties": single_defaults},
    ]


ACT_SCHEMAS, ACT_COMPONENTS = _schemas()
# For a model with a Box(4,) observation space, such as the embedded default "cartpole".
_EXAMPLES = {
    "single": {"summary": "One observation", "value": {"observation": [0.02, -0.01, 0.03, 0.04]}},
    "batch": {"summary": "Two observations, each the next step of its own session",
              "value": {"observations": [[0.02, -0.01, 0.03, 0.04], [0.0, 0.1, -0.05, 0.0]],
                        "session_ids": ["episode-a", "episode-b"], "episode_starts": [True, True]}},
}
_OPENAPI_EXTRA = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": ACT_SCHEMAS["request"],
                                                                      "examples": _EXAMPLES}}},
    "responses": {"200": {"description": "Actions", "content": {"application/json": {"schema": ACT_SCHEMAS["response"]}}}},
}
_ERRORS = errors(400, 404, 409, 410, 413, 422, 500, 503,
                 e409="Session bound to another version, or the request's sessions on different versions",
                 e422="Input does not fit the model's spaces, or every action masked",
                 e500="The batch's runtime call failed (batch_failed)",
                 e503="Queue full (see Retry-After), or the model is being unloaded")

router = APIRouter(tags=["act"])


def _service(request: Request) -> ActService:
    return request.app.state.act_service


async def _body(request: Request) -> bytes:
    return await read_body(request, body_limit(request))


@router.post("/v1/models/{name}/act", openapi_extra=_OPENAPI_EXTRA, responses=_ERRORS,
             summary="Act on one observation or a batch (current version, or a session's version)")
async def act(name: str, request: Request) -> Response:
    body = await _body(request)
    return Response(await _service(request).act(name, None, body), media_type="application/json")


@router.post("/v1/models/{name}/versions/{version}/act", openapi_extra=_OPENAPI_EXTRA, responses=_ERRORS,
             summary="Act with a pinned model version")
async def act_pinned(name: str, version: str, request: Request) -> Response:
    body = await _body(request)
    return Response(await _service(request).act(name, version, body), media_type="application/json")
