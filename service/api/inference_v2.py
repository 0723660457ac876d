"""The Open Inference Protocol's routes (KServe v2 REST): health, metadata, infer.

Thin: the answers come from ``rlserve.service.protocols.kserve_v2``. ``POST .../infer`` is
answered ahead of FastAPI on the fast path (``protocols.kserve_v2.route``); the routes here
document it and serve it when the fast path is off. Every refusal on these routes is the
protocol's ``{"error": "..."}`` (``protocols.kserve_v2.errors``), not the JSON API's shape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec
from fastapi import APIRouter, Request, Response

from rlserve.service.api.bodies import body_limit, read_body
from rlserve.service.errors import ServiceError, as_service_error
from rlserve.service.protocols.kserve_v2 import errors, metadata, wire
from rlserve.service.protocols.kserve_v2.handler import InferService

log = logging.getLogger("rlserve.api")
router = APIRouter(tags=["open inference protocol (v2)"])


def _schemas() -> tuple[dict[str, Any], dict[str, Any]]:
    structs = [wire.InferRequest, wire.InferResponse, wire.ModelMetadataResponse, wire.ServerMetadataResponse,
               wire.ServerLiveResponse, wire.ServerReadyResponse, wire.ModelReadyResponse, wire.InferErrorResponse]
    refs, components = msgspec.json.schema_components(structs, ref_template="#/components/schemas/{name}")
    return {struct.__name__: ref for struct, ref in zip(structs, refs, strict=True)}, components


SCHEMAS, V2_COMPONENTS = _schemas()


def _json(schema: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": SCHEMAS[schema]}}}


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    why = {400: "Malformed request, or input that does not fit the model (the message names the tensor, what "
                "was expected and what was received)",
           404: "Unknown model, version or sequence",
           413: "Body over RLSERVE_MAX_BODY_BYTES",
           500: "The runtime failed on this request's batch",
           503: "Not ready, or the model's queue is full (see Retry-After)"}
    return {code: _json("InferErrorResponse", why[code]) for code in codes}


_BINARY_BODY = {"type": "string", "format": "binary",
                "description": "Binary tensor data extension: the JSON inference request "
                               "(Inference-Header-Content-Length bytes) followed by the binary inputs"}
_INFER_OPENAPI = {
    "requestBody": {"required": True, "content": {
        "application/json": {"schema": SCHEMAS["InferRequest"]},
        "application/octet-stream": {"schema": _BINARY_BODY},
    }},
    "parameters": [{"name": "Inference-Header-Content-Length", "in": "header", "required": False,
                    "description": "Size of the JSON header when binary tensor data follows it",
                    "schema": {"type": "integer", "minimum": 1}}],
    "responses": {"200": {
        "description": "Outputs: JSON, or with binary outputs the JSON header (Inference-Header-Content-Length "
                       "bytes) followed by their binary data",
        "headers": {"Inference-Header-Content-Length": {
            "description": "Size of the JSON header when binary outputs follow it", "schema": {"type": "integer"}}},
        "content": {"application/json": {"schema": SCHEMAS["InferResponse"]},
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}},
}


def _reply(obj: Any, status: int = 200) -> Response:
    return Response(wire.ENCODER.encode(obj), status_code=status, media_type="application/json")


def _refusal(request: Request, error: ServiceError) -> Response:
    status, body, headers = errors.error_reply(error, request.app.state.metrics)
    return Response(body, status_code=status, media_type="application/json",
                    headers={k.decode("latin-1"): v.decode("latin-1") for k, v in headers} or None)


def _answer(request: Request, make: Callable[[], Any]) -> Response:
    try:
        return _reply(make())
    except ServiceError as exc:
        return _refusal(request, exc)


# --------------------------------------------------------------------------- health

@router.get("/v2/health/live", summary="The server is live", responses={200: _json("ServerLiveResponse", "Live")})
async def server_live() -> Response:
    return _reply(wire.ServerLiveResponse(live=True))


# The protocol's health answers are their status: 200 true, a 4xx false (Triton's 400).
NOT_READY = 400


@router.get("/v2/health/ready", summary="Ready: at least one model loaded, not draining or shutting down",
            responses={200: _json("ServerReadyResponse", "Ready"),
                       NOT_READY: _json("ServerReadyResponse", "Not ready: no model loaded, or draining or shutting "
                                                           "down (the protocol answers false with a 4xx)")})
async def server_ready(request: Request) -> Response:
    state = request.app.state
    ready = metadata.server_ready(state.registry, state.shutting_down or state.draining)
    return _reply(wire.ServerReadyResponse(ready=ready), 200 if ready else NOT_READY)


@router.get("/v2", summary="Server metadata: name, version, extensions",
            responses={200: _json("ServerMetadataResponse", "Server metadata")})
async def server_metadata() -> Response:
    return _reply(metadata.server_metadata())


# --------------------------------------------------------------------------- models

_METADATA_RESPONSES = {200: _json("ModelMetadataResponse", "The model's input and output tensors"),
                       **_errors(400, 404)}
_READY_RESPONSES = {200: _json("ModelReadyResponse", "Ready"),
                    NOT_READY: _json("ModelReadyResponse", "Loaded but not serving (yet, or any more): false"),
                    **_errors(404)}


@router.get("/v2/models/{name}", summary="Model metadata (current version)", responses=_METADATA_RESPONSES)
async def model_metadata(name: str, request: Request) -> Response:
    return _answer(request, lambda: metadata.model_metadata(request.app.state.registry, name, None))


@router.get("/v2/models/{name}/versions/{version}", summary="Model metadata (one version)",
            responses=_METADATA_RESPONSES)
async def version_metadata(name: str, version: str, request: Request) -> Response:
    return _answer(request, lambda: metadata.model_metadata(request.app.state.registry, name, version))


async def _ready(request: Request, name: str, version: str | None) -> Response:
    try:
        ready = metadata.model_ready(request.app.state.registry, name, version)
    except ServiceError as exc:
        return _refusal(request, exc)
    return _reply(ready, 200 if ready.ready else NOT_READY)


@router.get("/v2/models/{name}/ready", summary="Model readiness (current version)", responses=_READY_RESPONSES)
async def model_ready(name: str, request: Request) -> Response:
    return await _ready(request, name, None)


@router.get("/v2/models/{name}/versions/{version}/ready", summary="Model readiness (one version)",
            responses=_READY_RESPONSES)
async def version_ready(name: str, version: str, request: Request) -> Response:
    return await _ready(request, name, version)


# --------------------------------------------------------------------------- infer

async def _infer(request: Request, name: str, version: str | None) -> Response:
    service: InferService = request.app.state.infer_service
    try:
        body = await read_body(request, body_limit(request))
        answer = await service.infer(name, version, request.headers.get("inference-header-content-length"), body)
    except Exception as exc:  # every refusal in the protocol's shape, a bug as its 500
        return _refusal(request, as_service_error(exc, log, "infer failed"))
    headers = dict((k.decode("latin-1"), v.decode("latin-1")) for k, v in answer.headers())
    return Response(answer.body, headers=headers)


_INFER_RESPONSES = _errors(400, 404, 413, 500, 503)


@router.post("/v2/models/{name}/infer", openapi_extra=_INFER_OPENAPI, responses=_INFER_RESPONSES,
             summary="Act on a batch of observation tensors (current version, or a sequence's version)")
async def infer(name: str, request: Request) -> Response:
    return await _infer(request, name, None)


@router.post("/v2/models/{name}/versions/{version}/infer", openapi_extra=_INFER_OPENAPI, responses=_INFER_RESPONSES,
             summary="Act on a batch of observation tensors with a pinned version")
async def infer_pinned(name: str, version: str, request: Request) -> Response:
    return await _infer(request, name, version)
