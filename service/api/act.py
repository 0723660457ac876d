"""The documented act routes: the same endpoints as the raw ASGI handler, for OpenAPI.

``rlserve.service.act.asgi.RawActHandler`` (or the act protocol) answers these paths before
FastAPI's router sees them; these routes serve them only when the hot path is turned off.
Their schemas come from the msgspec structs of ``rlserve.service.act.wire``.
"""

from __future__ import annotations

from typing import Any

import msgspec
from fastapi import APIRouter, Request, Response

from rlserve.service.act.use_case import ActService
from rlserve.service.act.wire import ActRequest, ActResponse
from rlserve.service.api.bodies import body_limit, read_body


def _schemas() -> tuple[dict[str, Any], dict[str, Any]]:
    (request, response), components = msgspec.json.schema_components(
        [ActRequest, ActResponse], ref_template="#/components/schemas/{name}")
    return {"request": request, "response": response}, components


ACT_SCHEMAS, ACT_COMPONENTS = _schemas()
_OPENAPI_EXTRA = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": ACT_SCHEMAS["request"]}}},
    "responses": {"200": {"description": "Actions", "content": {"application/json": {"schema": ACT_SCHEMAS["response"]}}}},
}
_ERRORS: dict[int | str, dict[str, Any]] = {code: {"description": why, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}
           for code, why in {400: "Malformed request", 404: "Unknown model, version or session",
                             409: "Session bound to another version", 410: "Session expired or ended",
                             422: "Input does not fit the model's spaces, or every action masked",
                             503: "Queue full (see Retry-After)"}.items()}

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
