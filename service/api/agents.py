"""Policy sets (multi-agent): the documented act route and the episodes' lifecycle.

``POST /v1/models/{name}/agents/act`` is answered ahead of FastAPI like the act route
(``rlserve.service.multiagent.route``); this route serves it when the hot path is off and
documents it, its schemas from the msgspec structs of ``rlserve.service.multiagent.wire``.
An episode (a multi-agent session) is created, inspected, exported (``Accept:
application/octet-stream``), imported and ended under ``/v1/models/{name}/episodes``.
"""

from __future__ import annotations

from typing import Any

import msgspec
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from rlserve.service.act.wire import schema_hook
from rlserve.service.api.bodies import body_limit, read_body, read_model
from rlserve.service.api.openapi import errors
from rlserve.service.api.schemas import CreateEpisode, EpisodeInfo
from rlserve.service.errors import BadRequest
from rlserve.service.multiagent.episode_service import EpisodeService
from rlserve.service.multiagent.use_case import AgentsActService
from rlserve.service.multiagent.wire import AgentsActRequest, AgentsActResponse

router = APIRouter(tags=["multi-agent"])
OCTET_STREAM = "application/octet-stream"

(_REQUEST, _RESPONSE), AGENTS_COMPONENTS = msgspec.json.schema_components(
    [AgentsActRequest, AgentsActResponse], schema_hook=schema_hook, ref_template="#/components/schemas/{name}")
_EXAMPLE = {"summary": "Two agents of a new episode",
            "value": {"episode_id": "match-1", "episode_start": True, "seed": 7,
                      "agents": {"player_0": {"observation": 3}, "player_1": {"observation": 3}}}}
_OPENAPI_EXTRA = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": _REQUEST,
                                                                       "examples": {"start": _EXAMPLE}}}},
    "responses": {"200": {"description": "Each agent's action and the policy that answered",
                          "content": {"application/json": {"schema": _RESPONSE}}}},
}
_ERRORS = errors(400, 404, 409, 410, 413, 422, 500, 503, e404="Unknown policy set or episode",
                 e409="An agent's session changed elsewhere, or the episode exists",
                 e422="An agent's input does not fit its policy's spaces",
                 e503="Not ready or queue full (see Retry-After), or episodes need a shared store (--workers N "
                      "without RLSERVE_SESSION_STORE)")
_BINARY = {"schema": {"type": "string", "format": "binary"}}


def _agents(request: Request) -> AgentsActService:
    return request.app.state.agents_service


def _episodes(request: Request) -> EpisodeService:
    return request.app.state.episode_service


@router.post("/v1/models/{name}/agents/act", openapi_extra=_OPENAPI_EXTRA, responses=_ERRORS,
             summary="Act for several agents of one environment step, each by the policy the set maps it to")
async def agents_act(name: str, request: Request) -> Response:
    body = await read_body(request, body_limit(request))
    return Response(await _agents(request).agents_act(name, body), media_type="application/json")


@router.post("/v1/models/{name}/episodes", status_code=201, response_model=EpisodeInfo, responses=_ERRORS,
             openapi_extra={"requestBody": {"required": False, "content": {
                 "application/json": {"schema": CreateEpisode.model_json_schema()}}}},
             summary="Create a multi-agent episode (optionally seeded)")
async def create_episode(name: str, request: Request) -> JSONResponse:
    body = await read_model(request, CreateEpisode, empty=CreateEpisode())
    info = await _episodes(request).open(name, body.episode_id, body.seed)
    return JSONResponse(info, status_code=201)


@router.get("/v1/models/{name}/episodes/{episode_id:path}", response_model=EpisodeInfo,
            responses={200: {"content": {OCTET_STREAM: _BINARY}}, **_ERRORS},
            summary="Inspect an episode (JSON), or export it as bytes with Accept: application/octet-stream")
async def get_episode(name: str, episode_id: str, request: Request) -> Response:
    if OCTET_STREAM in request.headers.get("accept", ""):
        return Response(await _episodes(request).export(name, episode_id), media_type=OCTET_STREAM)
    return JSONResponse(await _episodes(request).describe(name, episode_id))


@router.put("/v1/models/{name}/episodes/{episode_id:path}", response_model=EpisodeInfo, responses=_ERRORS,
            openapi_extra={"requestBody": {"required": True, "content": {OCTET_STREAM: _BINARY}}},
            summary="Import an exported episode (Content-Type: application/octet-stream) under this id")
async def put_episode(name: str, episode_id: str, request: Request) -> dict[str, Any]:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != OCTET_STREAM:
        raise BadRequest("send the exported episode bytes as application/octet-stream", field="Content-Type",
                         expected=OCTET_STREAM, received=content_type or None)
    data = await read_body(request, body_limit(request))
    return await _episodes(request).import_(name, episode_id, data)


@router.delete("/v1/models/{name}/episodes/{episode_id:path}", response_model=EpisodeInfo, responses=_ERRORS,
               summary="End an episode: every agent's state ends; later use of its id answers 410")
async def end_episode(name: str, episode_id: str, request: Request) -> dict[str, Any]:
    return await _episodes(request).end(name, episode_id)
