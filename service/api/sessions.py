"""Session lifecycle: create (optionally seeded and version-bound), inspect, end.

Session ids may hold any characters, ``/`` included (the act routes accept them too), so
the id in a URL is percent-encoded (``a/b`` as ``a%2Fb``) and the routes take the rest of
the decoded path as the id.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from rlserve.service.api.bodies import read_model
from rlserve.service.api.openapi import errors
from rlserve.service.api.schemas import CreateSession, SessionInfo
from rlserve.service.errors import SessionConflict
from rlserve.service.serving.policy import Policy
from rlserve.service.serving.registry import ModelRegistry
from rlserve.service.sessions.store import Session

router = APIRouter(tags=["sessions"])


def _registry(request: Request) -> ModelRegistry:
    return request.app.state.registry


def _info(policy: Policy, session: Session) -> SessionInfo:
    store = policy.sessions
    return SessionInfo(session_id=session.id, model=policy.name, version=policy.version, seed=session.seed,
                       steps=session.steps, idle_s=max(0.0, store.clock() - session.last_used),
                       idle_ttl_s=store.idle_ttl_s)


_CREATE_BODY = {"requestBody": {"required": False,
                                 "content": {"application/json": {"schema": CreateSession.model_json_schema()}}}}
_CREATE_ERRORS = errors(400, 404, 409, 413, 503, e404="Unknown model or version",
                        e409="A live session has this id", e503="Every session has a request in flight")
_LOOKUP_ERRORS = errors(404, 410, e404="Unknown model or session")


@router.post("/v1/models/{name}/sessions", status_code=201, response_model=SessionInfo, openapi_extra=_CREATE_BODY,
             responses=_CREATE_ERRORS, summary="Create a session on the current (or a given) version")
async def create_session(name: str, request: Request) -> JSONResponse:
    # Read by hand, not as a FastAPI body parameter: the size limit and the error codes
    # (invalid_json vs bad_request naming the field) are the project's, as on the act route.
    body = await read_model(request, CreateSession, empty=CreateSession())
    entry = _registry(request).entry(name)
    policy = entry.policy(body.version)
    if body.session_id is not None and entry.is_live(body.session_id):
        # Ids are unique per model name across versions, so later lookups are unambiguous.
        raise SessionConflict(
            f"session {body.session_id!r} already exists", field="session_id", received=body.session_id
        )
    session = policy.sessions.create(body.session_id, body.seed)
    return JSONResponse(_info(policy, session).model_dump(), status_code=201)


@router.get("/v1/models/{name}/sessions/{session_id:path}", response_model=SessionInfo, responses=_LOOKUP_ERRORS,
            summary="Inspect a session")
async def get_session(name: str, session_id: str, request: Request) -> SessionInfo:
    policy, session = _registry(request).entry(name).find_session(session_id)
    return _info(policy, session)


@router.delete("/v1/models/{name}/sessions/{session_id:path}", response_model=SessionInfo, responses=_LOOKUP_ERRORS,
               summary="End a session; later use of its id answers 410")
async def end_session(name: str, session_id: str, request: Request) -> SessionInfo:
    policy, session = _registry(request).entry(name).find_session(session_id)
    policy.sessions.end(session_id)
    return _info(policy, session)
