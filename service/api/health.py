"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from rlserve.service.api.schemas import Readiness

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is up")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", response_model=Readiness,
            responses={503: {"model": Readiness,
                             "description": "Not ready: no model loaded, or draining or shutting down"}},
            summary="Ready to serve: at least one model loaded, not draining or shutting down")
async def readyz(request: Request) -> JSONResponse:
    state = request.app.state
    models = {e.name: e.current for e in state.registry.entries.values()}
    stopping = state.shutting_down or state.draining
    ready = bool(models) and not stopping
    body = {"ready": ready, "models": models, "failed_to_load": state.registry.failures}
    if not ready:
        reason = "shutting down" if stopping else "no models loaded"
        body["error"] = {"code": "not_ready", "message": reason, "field": None, "expected": None, "received": None}
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses={200: {"description": "Prometheus text exposition format",
                             "content": {"text/plain": {"schema": {"type": "string"}}}}})
async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
