"""``create_app(settings)``: the FastAPI application with the raw act hot path in front.

The app loads every bundle of the repository (or the embedded defaults) when it is
created, so it is ready as soon as it accepts connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from rlserve.models.multiagent.mapping import AgentMapping
from rlserve.service.access_log import ACCESS_KEY, AccessLog, access_asgi
from rlserve.service.act.asgi import RawActHandler
from rlserve.service.act.use_case import ActService
from rlserve.service.api import (
    act,
    admin,
    agents,
    bodies,
    docs_page,
    experience,
    health,
    inference_v2,
    listing,
    rollout,
    sessions,
)
from rlserve.service.api.openapi import drop_fastapi_validation_errors
from rlserve.service.api.schemas import ErrorResponse
from rlserve.service.engine.metrics import Metrics
from rlserve.service.errors import (
    MAX_ECHO,
    BadRequest,
    InternalError,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    ServiceError,
    bounded,
    error_reply,
)
from rlserve.service.experience.log import ExperienceLog
from rlserve.service.multiagent.episode_service import EpisodeService
from rlserve.service.multiagent.route import AgentsActRoute
from rlserve.service.multiagent.use_case import AgentsActService
from rlserve.service.protocols.kserve_v2 import metadata
from rlserve.service.protocols.kserve_v2.errors import error_reply as v2_error_reply
from rlserve.service.protocols.kserve_v2.handler import InferService
from rlserve.service.protocols.kserve_v2.route import InferRoute
from rlserve.service.redaction import PathRedactor
from rlserve.service.serving.registry import ModelRegistry
from rlserve.service.serving.repository import poll_repository
from rlserve.service.sessions.redis_client import RedisSessions
from rlserve.service.settings import Settings
from rlserve.service.stream.connection import StreamLimits
from rlserve.service.stream.route import StreamRoute
from rlserve.service.stream.upgrade import FastUpgrade

log = logging.getLogger("rlserve.app")

DEFAULT_MODELS = Path(__file__).resolve().parent / "default_models"
GRPC_GRACE_S = 10.0  # how long gRPC calls in flight may take to finish at shutdown


class RLServeApp(FastAPI):
    """FastAPI plus a pre-router dispatch of the fast routes (act, infer) to ``RawActHandler``,
    and the access log around both when it is on."""

    raw_act: RawActHandler | None = None
    stream: StreamRoute | None = None  # the WebSocket streams' upgrades (ASGI)
    stream_upgrade: FastUpgrade | None = None  # the same, inside the act protocol (``rlserve serve``)
    logged: Any = None  # ``_dispatch`` inside the access log (None: the log is off)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self.logged is not None:
            await self.logged(scope, receive, send)
        else:
            await self._dispatch(scope, receive, send)

    async def _dispatch(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket" and self.stream is not None:
            found = self.stream.match(scope)
            if found is not None:
                await self.stream(scope, receive, send, found)
                return
        handler = self.raw_act
        if handler is not None:
            match = handler.match(scope)
            if match is not None:
                note = scope.get(ACCESS_KEY)
                if note is not None:  # the access log names the route by this match
                    note.match = match[1]
                await handler(scope, receive, send, match)
                return
        await super().__call__(scope, receive, send)


def create_app(settings: Settings | None = None, *, registry: ModelRegistry | None = None) -> RLServeApp:
    """Build the app; loads the repository unless a ready ``registry`` is given."""
    settings = settings or Settings()
    metrics = Metrics()
    repository = settings.repository or DEFAULT_MODELS
    experience_log = ExperienceLog.from_settings(settings, metrics)
    if registry is None:
        registry = ModelRegistry(settings, metrics, _session_store(settings, metrics), experience_log)
        if settings.repository is not None or not (settings.checkpoints or settings.policy_sets):
            _load_models(registry, repository, settings)
        registry.load_checkpoints(settings.checkpoints)
        registry.load_policy_sets(settings.policy_sets, _mapping(settings))
        registry.start_shadows(settings.shadow)
    for name in registry.unapplied_splits():
        log.warning("RLSERVE_CANARY names model %r, whose versions %s are not all loaded: its split applies once "
                    "they are", name, sorted(settings.canary[name]))
    metrics.watch_sessions(registry.session_counts)
    metrics.watch_queues(registry.queued_rows)
    metrics.watch_shadows(registry.shadows.stats)
    access_log = AccessLog(settings.access_log, settings.access_log_format)
    service = ActService(registry, metrics, access_log=access_log.enabled)
    infer_service = InferService(service)
    agents_service = AgentsActService(registry, service)

    # /docs is docs_page's (Swagger UI's assets served here, no CDN); FastAPI's own pages are off.
    app = RLServeApp(title="rlserve", version="0.1.0", lifespan=_lifespan, docs_url=None, redoc_url=None,
                     description="Inference service for RLlib-trained policies.")
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.registry = registry
    app.state.repository = repository
    app.state.act_service = service
    app.state.experience = experience_log
    app.state.infer_service = infer_service
    app.state.agents_service = agents_service
    app.state.episode_service = EpisodeService(registry)
    app.state.shutting_down = False
    app.state.draining = False  # SIGTERM received: /readyz says 503 while requests are still answered
    app.state.access_log = access_log
    if access_log.enabled:
        app.logged = access_asgi(app._dispatch, access_log)
    if settings.fast_act_path:
        app.raw_act = RawActHandler(service, metrics, settings.max_body_bytes,
                                    routes=[InferRoute(infer_service), AgentsActRoute(agents_service)])
    app.stream = StreamRoute(service, metrics, access_log, settings.stream_max_connections, StreamLimits(
        settings.stream_max_inflight, settings.stream_max_unreadable, settings.max_body_bytes), settings.openpi_model,
        agents=agents_service)
    app.stream_upgrade = FastUpgrade(app.stream)
    metrics.watch_streams(app.stream.open_by_kind)
    # rollout and admin share the /v1/admin/models/{name} prefix; neither shadows a route of the other.
    for router in (health.router, act.router, listing.router, sessions.router, rollout.router, admin.router,
                   inference_v2.router,
                   agents.router, docs_page.router, experience.router):
        app.include_router(router)
    _install_error_handlers(app, metrics, PathRedactor(repository, Path(__file__).resolve().parent))
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _mapping(settings: Settings) -> AgentMapping | None:
    return None if settings.agent_mapping is None else AgentMapping.from_json(settings.agent_mapping)


def _session_store(settings: Settings, metrics: Metrics) -> RedisSessions | None:
    if settings.session_store is None:
        if settings.workers > 1:
            log.warning("%d workers and no RLSERVE_SESSION_STORE: creating sessions is refused (stateless requests "
                        "work); set RLSERVE_SESSION_STORE=redis://... to share sessions between workers",
                        settings.workers)
        return None
    return RedisSessions(settings.session_store, prefix=settings.session_store_prefix,
                         timeout_s=settings.session_store_timeout_s, observer=metrics)


def _load_models(registry: ModelRegistry, repository: Path, settings: Settings) -> None:
    source = "repository" if settings.repository else "embedded default models"
    if not repository.is_dir():
        log.warning("%s %s does not exist: starting with no models", source, repository)
        return
    registry.load_repository(repository)
    if not registry.entries:
        log.warning("no bundles found in %s %s: starting with no models", source, repository)
    for entry in registry.entries.values():
        log.info("model %r: versions %s, current %s", entry.name, list(entry.versions), entry.current)


@contextlib.asynccontextmanager
async def _lifespan(app: RLServeApp):
    tasks = [asyncio.create_task(_sweep_sessions(app))]
    settings = app.state.settings
    if settings.repository_poll_s > 0 and settings.repository is not None:
        tasks.append(asyncio.create_task(poll_repository(app.state.registry, app.state.repository,
                                                         settings.repository_poll_s)))
    grpc_server = await _start_grpc(app) if settings.grpc_port is not None else None
    try:
        yield
    finally:
        # The server stopped accepting and answered what was in flight; every answered step
        # was written before its answer (write-through), so nothing is left to persist.
        app.state.shutting_down = True
        if grpc_server is not None:  # refuses new calls, answers those in flight
            await grpc_server.stop(GRPC_GRACE_S)
        for task in tasks:
            task.cancel()
        await asyncio.to_thread(app.state.registry.shadows.close)  # their processes write their logs and exit
        for policy in app.state.registry.policies():
            await policy.close()  # uploaded archives' unpacked files too
        if app.state.experience is not None:  # the batchers stopped: write what the log holds
            await asyncio.to_thread(app.state.experience.close)
        if app.state.registry.store is not None:
            await app.state.registry.store.close()


async def _start_grpc(app: RLServeApp) -> Any:
    """The Open Inference Protocol's gRPC service on ``RLSERVE_GRPC_PORT``, on this loop."""
    from rlserve.service.protocols.kserve_v2.grpc_server import GrpcInferenceService, start_server

    state, settings = app.state, app.state.settings
    service = GrpcInferenceService(
        state.infer_service, lambda: metadata.server_ready(state.registry, state.shutting_down or state.draining),
        state.metrics)
    server, port = await start_server(service, settings.host, settings.grpc_port, settings.max_body_bytes)
    log.info("Open Inference Protocol over gRPC on %s:%d", settings.host, port)
    return server


async def _sweep_sessions(app: RLServeApp) -> None:
    """Expire idle sessions in the background (lookups also expire them lazily)."""
    ttl = app.state.settings.session_idle_ttl_s
    while True:
        await asyncio.sleep(min(max(ttl / 4, 0.05), 30.0))
        for entry in list(app.state.registry.entries.values()):
            entry.sessions.sweep_idle()


def _install_error_handlers(app: FastAPI, metrics: Metrics, redact: PathRedactor) -> None:
    def respond(request: Request, exc: ServiceError) -> Response:
        # Under /v2 (the Open Inference Protocol) every refusal is that protocol's shape.
        path = request.url.path
        reply = v2_error_reply if path == "/v2" or path.startswith("/v2/") else error_reply
        status, body, headers = reply(redact(exc), metrics)
        return Response(body, status_code=status, media_type="application/json",
                        headers={k.decode("latin-1"): v.decode("latin-1") for k, v in headers} or None)

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> Response:
        return respond(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        # The project's 400 (dotted field path, expected, received), never FastAPI's 422 list.
        return respond(request, bodies.bad_request(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        path = bounded(request.url.path, MAX_ECHO)  # a client's; a long one by its length
        if exc.status_code == 404:
            return respond(request, NotFound(f"no route {request.method} {path}"))
        if exc.status_code == 405:
            return respond(request, MethodNotAllowed(f"{request.method} is not allowed on {path}",
                                                     headers={"Allow": _allowed_methods(request)}))
        if exc.status_code == 400:  # e.g. Starlette's body parsing: keep to the documented codes
            return respond(request, BadRequest(f"bad request: {exc.detail}"))
        if exc.status_code == 413:
            return respond(request, PayloadTooLarge(f"request body too large: {exc.detail}"))
        error = ServiceError(str(exc.detail))
        error.status, error.code = exc.status_code, f"http_{exc.status_code}"
        return respond(request, error)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, bounded(request.url.path, MAX_ECHO))
        return respond(request, InternalError(f"internal error: {type(exc).__name__}"))


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _allowed_methods(request: Request) -> str:
    """The ``Allow`` of a 405: every method some route answers on this path. Starlette's own
    names only the first route that matched the path (GET and DELETE of a session are two)."""
    scope = {k: v for k, v in request.scope.items() if k not in ("fastapi", "route", "endpoint", "path_params")}
    allowed = [
        method
        for method in _METHODS
        if any(route.matches({**scope, "method": method})[0] is Match.FULL for route in request.app.router.routes)
    ]
    return ", ".join(allowed)


def _openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        drop_fastapi_validation_errors(schema)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(act.ACT_COMPONENTS)
        components.update(inference_v2.V2_COMPONENTS)
        components.update(agents.AGENTS_COMPONENTS)
        error_schema = ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(error_schema.pop("$defs", {}))
        components["ErrorResponse"] = error_schema
        app.openapi_schema = schema
    return app.openapi_schema
