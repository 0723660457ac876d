"""The documented act routes: the same endpoints as the raw ASGI handler, for OpenAPI.

``rlserve.service.act.asgi.RawActHandler`` (or the act protocol) answers these paths before
FastAPI's router sees them; these routes serve them only when the hot path is turned off.
Their schemas come from the msgspec structs of ``rlserve.service.act.wire``.
"""

from __future__ import annotations

from typing import Any

import msgspec
from fastapi import APIRouter, Request, Response

from rlserve.service.act.binary import DTYPES, is_raw
from rlserve.service.act.raw import act_raw
from rlserve.service.act.use_case import ActService
from rlserve.service.act.wire import BATCH_COLUMNS, SINGLE_DEFAULTS, ActRequest, ActResponse, schema_hook
from rlserve.service.api.bodies import body_limit, read_body
from rlserve.service.api.openapi import errors
from rlserve.service.sessions.store import MAX_SESSION_ID_LENGTH


def _schemas() -> tuple[dict[str, Any], dict[str, Any]]:
    (request, response), components = msgspec.json.schema_components(
        [ActRequest, ActResponse], schema_hook=schema_hook, ref_template="#/components/schemas/{name}")
    _state_the_forms(components["ActRequest"])
    return {"request": request, "response": response}, components


def _state_the_forms(schema: dict[str, Any]) -> None:
    """Add to ``ActRequest``'s schema what ``wire.to_rows`` and the session lookup enforce
    beyond the field types: exactly one of ``observation`` / ``observations`` (a non-empty
    list), each form's fields only with it, session ids of 1..128 characters. (That each
    column has one entry per observation, and a session appears once per request, JSON
    Schema cannot say; the field descriptions do.)"""
    fields = schema["properties"]
    assert all(c in fields and c[:-1] in fields for c in BATCH_COLUMNS), "ActRequest fields changed"
    null = {"type": "null"}
    ids = [fields["session_id"], *[s["items"] for s in fields["session_ids"]["anyOf"] if s.get("type") == "array"]]
    for string in [s for field in ids for s in field["anyOf"] if s.get("type") == "string"]:
        string.update(minLength=1, maxLength=MAX_SESSION_ID_LENGTH)
    fields["observations"]["minItems"] = 1
    for column in BATCH_COLUMNS:
        fields[column]["description"] = (f"Batch form: one entry per observation (the list is as long as "
                                         f"'observations'); with 'observation' use '{column[:-1]}'")
    fields["session_ids"]["description"] += "; each session at most once per request"
    single_defaults = {name: null if default is None else {"const": default}
                       for name, default in SINGLE_DEFAULTS.items()}
    fields["step"]["description"] = ("Single form, with 'session_id': the steps this session answered in its "
                                     "episode before this one (0 with episode_start); a retry is answered again")
    with_step = {"required": ["step"], "properties": {"step": {"type": "integer"}}}
    schema["oneOf"] = [
        {"title": "single", "description": "One row: 'observation' and the single-form fields",
         "required": ["observation"], "not": {"required": ["observations"]},
         "properties": {column: null for column in BATCH_COLUMNS},
         # A step index counts a session's steps; an episode start is step 0.
         "allOf": [{"if": with_step, "then": {"required": ["session_id"],
                                              "properties": {"session_id": {"type": "string"}}}},
                   {"if": {"allOf": [with_step, {"required": ["episode_start"],
                                                 "properties": {"episode_start": {"const": True}}}]},
                    "then": {"properties": {"step": {"const": 0}}}}]},
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
_RAW_HEADERS = [
    {"name": "X-Rlserve-Dtype", "in": "header", "required": False,
     "description": "With an application/octet-stream body (required there): the dtype of its array",
     "schema": {"type": "string", "enum": list(DTYPES)}},
    {"name": "X-Rlserve-Shape", "in": "header", "required": False,
     "description": "With an application/octet-stream body (required there): the array's shape "
                    "B,d1,d2,... (B rows of the observation space's shape)",
     "schema": {"type": "string", "pattern": "^[0-9]+(,[0-9]+)*$"}},
    {"name": "X-Rlserve-Explore", "in": "header", "required": False,
     "description": "With an application/octet-stream body: sample (true) or take the mode (false)",
     "schema": {"type": "string", "enum": ["true", "false"]}},
    {"name": "X-Rlserve-Outputs", "in": "header", "required": False,
     "description": "With an application/octet-stream body: extra outputs, comma-separated "
                    "(value, entropy, dist_inputs, q_values, raw_action)",
     "schema": {"type": "string"}},
]
_OPENAPI_EXTRA = {
    "parameters": _RAW_HEADERS,
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": ACT_SCHEMAS["request"], "examples": _EXAMPLES},
            "application/octet-stream": {
                "schema": {"type": "string", "format": "binary",
                           "description": "A (B, *observation_shape) array's bytes, C order, little-endian, of "
                                          "the dtype and shape the X-Rlserve-Dtype and X-Rlserve-Shape headers "
                                          "give; answered with the JSON batch form"}},
        },
    },
    "responses": {
        "200": {"description": "Actions", "content": {"application/json": {"schema": ACT_SCHEMAS["response"]}}}
    },
}
_ERRORS = errors(400, 404, 409, 410, 413, 422, 500, 503,
                 e409="Session bound to another version, or the request's sessions on different versions",
                 e422="Input does not fit the model's spaces, or every action masked",
                 e500="The batch's runtime call failed (batch_failed)",
                 e503="Queue full (see Retry-After), the model is being unloaded, or sessions need a shared "
                      "store (--workers N without RLSERVE_SESSION_STORE)")

router = APIRouter(tags=["act"])


def _service(request: Request) -> ActService:
    return request.app.state.act_service


async def _body(request: Request) -> bytes:
    return await read_body(request, body_limit(request))


async def _act(request: Request, name: str, version: str | None) -> Response:
    body = await _body(request)
    if is_raw(request.scope["headers"]):
        answer = await act_raw(_service(request), name, version, request.scope["headers"], body)
    else:
        answer = await _service(request).act(name, version, body)
    return Response(answer, media_type="application/json")


@router.post("/v1/models/{name}/act", openapi_extra=_OPENAPI_EXTRA, responses=_ERRORS,
             summary="Act on one observation or a batch (current version, or a session's version)")
async def act(name: str, request: Request) -> Response:
    return await _act(request, name, None)


@router.post("/v1/models/{name}/versions/{version}/act", openapi_extra=_OPENAPI_EXTRA, responses=_ERRORS,
             summary="Act with a pinned model version")
async def act_pinned(name: str, version: str, request: Request) -> Response:
    return await _act(request, name, version)
