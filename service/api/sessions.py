"""Session lifecycle: create (optionally seeded and version-bound), inspect, export, import, end.

Session ids may hold any characters, ``/`` included (the act routes accept them too), so
the id in a URL is percent-encoded (``a/b`` as ``a%2Fb``) and the routes take the rest of
the decoded path as the id.

A session moves as bytes: ``GET`` with ``Accept: application/octet-stream`` answers its
record (``rlserve.service.sessions.record``: state, step count, seed and generator state,
version, kept answer) and ``PUT`` of such a body (``Content-Type: application/octet-stream``)
makes it session ``{session_id}`` here, on the record's version or ``?version=``, which
must have the same tensor layout. Under an external store these go through the store.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from rlserve.service.api.bodies import body_limit, read_body, read_model
from rlserve.service.api.openapi import errors
from rlserve.service.api.schemas import CreateSession, SessionInfo
from rlserve.service.errors import BadRequest, InvalidInput, quoted
from rlserve.service.serving.registry import ModelEntry, ModelRegistry
from rlserve.service.sessions.import_check import check_contents
from rlserve.service.sessions.record import RecordError, SessionRecord, record_version
from rlserve.service.sessions.store import Session, validate_session_id

router = APIRouter(tags=["sessions"])

OCTET_STREAM = "application/octet-stream"


def _registry(request: Request) -> ModelRegistry:
    return request.app.state.registry


def _info(entry: ModelEntry, session: Session, record: SessionRecord | None = None) -> SessionInfo:
    """What a session is; from ``record`` (the external store's) rather than the copy held here."""
    steps, seed = (session.steps, session.seed) if record is None else (record.steps, record.seed)
    idle_s, idle_ttl_s = entry.sessions.idle_s(session)
    return SessionInfo(session_id=session.id, model=entry.name, version=session.version, seed=seed,
                       steps=steps, idle_s=idle_s, idle_ttl_s=idle_ttl_s)


_CREATE_BODY = {"requestBody": {"required": False,
                                 "content": {"application/json": {"schema": CreateSession.model_json_schema()}}}}
_BINARY = {"schema": {"type": "string", "format": "binary"}}
_STORE = ("Not ready, queue full, or the external session store unavailable (see Retry-After); sessions need a "
          "shared store (--workers N without RLSERVE_SESSION_STORE)")
_CREATE_ERRORS = errors(400, 404, 409, 413, 503, e404="Unknown model or version",
                        e409="A live session has this id", e503="Every session has a request in flight, the external "
                                                                "session store is unavailable, or sessions need a "
                                                                "shared store (--workers N without a store)")
_LOOKUP_ERRORS = errors(404, 410, 500, 503, e404="Unknown model or session",
                        e500="The external store holds a record this server cannot read", e503=_STORE)
_IMPORT_ERRORS = errors(400, 404, 409, 413, 422, 503, e404="Unknown model or version",
                        e409="The session has a request in flight",
                        e422="The body is not a session record of that version's tensor layout", e503=_STORE)


@router.post("/v1/models/{name}/sessions", status_code=201, response_model=SessionInfo, openapi_extra=_CREATE_BODY,
             responses=_CREATE_ERRORS,
             summary="Create a session on the current (or a given) version")
async def create_session(name: str, request: Request) -> JSONResponse:
    # Read by hand, not as a FastAPI body parameter: the size limit and the error codes
    # (invalid_json vs bad_request naming the field) are the project's, as on the act route.
    body = await read_model(request, CreateSession, empty=CreateSession())
    entry = _registry(request).entry(name)
    policy = entry.policy(entry.drawn(body.version, body.session_id))  # a split's draw unless it names one
    session = await entry.sessions.open(body.session_id, policy.version, body.seed)
    return JSONResponse(_info(entry, session).model_dump(), status_code=201)


@router.get("/v1/models/{name}/sessions/{session_id:path}", response_model=SessionInfo,
            summary="Inspect a session (JSON), or export it as bytes with Accept: application/octet-stream",
            responses={200: {"content": {OCTET_STREAM: _BINARY}}, **_LOOKUP_ERRORS})
async def get_session(name: str, session_id: str, request: Request) -> Response:
    entry = _registry(request).entry(name)
    session = await entry.sessions.lookup(session_id)
    if OCTET_STREAM in request.headers.get("accept", ""):
        data = await entry.sessions.export(session)
        return Response(data, media_type=OCTET_STREAM, headers={"x-rlserve-version": session.version})
    return JSONResponse(_info(entry, session, await entry.sessions.stored_record(session)).model_dump())


@router.put("/v1/models/{name}/sessions/{session_id:path}", response_model=SessionInfo,
            summary="Import a session exported as bytes (Content-Type: application/octet-stream), replacing "
                    "one of that id; ?version= binds it to another version of the same layout",
            responses=_IMPORT_ERRORS,
            openapi_extra={"requestBody": {"required": True, "content": {OCTET_STREAM: _BINARY}}})
async def put_session(name: str, session_id: str, request: Request, version: str | None = None) -> SessionInfo:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != OCTET_STREAM:
        raise BadRequest("send the exported session bytes as application/octet-stream", field="Content-Type",
                         expected=OCTET_STREAM, received=content_type or None)
    validate_session_id(session_id)
    data = await read_body(request, body_limit(request))
    entry = _registry(request).entry(name)
    try:
        target = version or record_version(data)
    except RecordError as exc:
        raise InvalidInput(f"body: not a session record: {exc}", field="body", expected=_EXPORTED,
                           received=f"{len(data)} bytes") from None
    policy = entry.policy(target)  # 404 naming the loaded versions
    layout = entry.sessions.layout(policy.version)
    try:
        record = layout.decode(data)
        check_contents(record, policy.bundle.manifest.signature, policy.pipeline)
    except RecordError as exc:
        raise InvalidInput(f"body: {exc}", field="body",
                           expected=f"a session record of {quoted(name)} version {policy.version!r} (tensors "
                                    f"{layout.description})", received=f"{len(data)} bytes") from None
    entry.sessions.check_idle(session_id, "session_id", f"session {quoted(session_id)}")
    session = await entry.sessions.import_record(session_id, policy.version, record)
    return _info(entry, session)


_EXPORTED = "the bytes of GET /v1/models/{name}/sessions/{id} with Accept: application/octet-stream"


@router.delete("/v1/models/{name}/sessions/{session_id:path}", response_model=SessionInfo, responses=_LOOKUP_ERRORS,
               summary="End a session; later use of its id answers 410")
async def end_session(name: str, session_id: str, request: Request) -> SessionInfo:
    entry = _registry(request).entry(name)
    session = await entry.sessions.lookup(session_id)
    await entry.sessions.close(session)
    return _info(entry, session)
