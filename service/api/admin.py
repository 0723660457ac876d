"""Admin API: list, load (repository path or uploaded archive), unload, metadata, shadows.

Disabled (404 ``admin_disabled``) unless ``RLSERVE_ADMIN_TOKEN`` is set; then every call
needs ``Authorization: Bearer <token>`` (401 without it, 403 with a wrong one).
"""

from __future__ import annotations

import asyncio
import hmac
import os
import tempfile
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer

from rlserve.service.act.body import body_chunks
from rlserve.service.api.bodies import body_limit, parse_json, read_body, read_model, validate
from rlserve.service.api.openapi import body_schema, errors
from rlserve.service.api.schemas import Loaded, LoadFromPath, StartShadow, Unloaded
from rlserve.service.errors import (
    AdminDisabled,
    BadRequest,
    BundleInvalid,
    Forbidden,
    PathOutsideRepository,
    ServiceError,
    Unauthorized,
    quoted,
)
from rlserve.service.serving.loading import ARCHIVE_SUFFIX, fingerprint
from rlserve.service.serving.policy import Policy
from rlserve.service.serving.registry import ModelRegistry
from rlserve.service.serving.repository import save_upload

UPLOAD = "uploaded archive"  # how errors name an upload (never by its temporary file)


def require_admin(request: Request) -> None:
    token = request.app.state.settings.admin_token
    if token is None:
        raise AdminDisabled("the admin API is disabled: set RLSERVE_ADMIN_TOKEN to enable it")
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise Unauthorized("admin API: send 'Authorization: Bearer <token>'", field="Authorization",
                           headers={"WWW-Authenticate": "Bearer"})
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise Forbidden("admin API: wrong token", field="Authorization")


# Documents the bearer scheme in OpenAPI; never refuses (require_admin does, with the project's errors).
_BEARER = HTTPBearer(auto_error=False, description="RLSERVE_ADMIN_TOKEN")

router = APIRouter(prefix="/v1/admin", tags=["admin"], dependencies=[Depends(_BEARER), Depends(require_admin)],
                   responses=errors(401, 403, 404, e404="The admin API is disabled (no RLSERVE_ADMIN_TOKEN), "
                                                        "or an unknown model or version"))


def _registry(request: Request) -> ModelRegistry:
    return request.app.state.registry


@router.get("/models", summary="Every loaded version with runtime, sessions and bundle path")
async def list_loaded(request: Request) -> dict[str, Any]:
    registry = _registry(request)
    models = []
    for entry in registry.entries.values():
        for version, policy in entry.versions.items():
            models.append({"name": entry.name, "version": version, "current": version == entry.current,
                           "runtime": policy.runtime.describe(), "active_sessions": len(policy.sessions),
                           "queued_rows": policy.batcher.queued_rows if policy.batcher else 0,
                           "bundle": str(policy.bundle.root)})
    return {"models": models, "failed_to_load": registry.failures,
            "repository": str(request.app.state.repository)}


@router.get("/models/{name}/versions/{version}", summary="Full metadata of one version, files included")
async def admin_metadata(name: str, version: str, request: Request) -> dict[str, Any]:
    policy = _registry(request).entry(name).policy(version)
    manifest = policy.bundle.manifest
    return {**policy.metadata(), "bundle": str(policy.bundle.root), "files": manifest.files,
            "runtimes": {k: v.info for k, v in manifest.runtimes.items()}}


@router.post("/models", status_code=201, response_model=Loaded,
             summary="Load a bundle: JSON {'path': ...} inside the repository, or an .rlsb archive as the body "
                     "(Content-Type: application/octet-stream)",
             responses=errors(400, 409, 413, 422, e409="That version of the model is already loaded",
                              e422="No loadable bundle there: no manifest, a bad file, or its reference check failed"),
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": LoadFromPath.model_json_schema()},
                 "application/octet-stream": {"schema": {"type": "string", "format": "binary", "minLength": 1}}}}})
async def load(request: Request) -> JSONResponse:
    state = request.app.state
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/octet-stream":
        return await _load_upload(request)
    elif content_type in ("application/json", ""):
        body = validate(LoadFromPath, parse_json(await read_body(request, body_limit(request))))
        path = resolve_in_repository(state.repository, body.path)
        try:
            policy = await asyncio.to_thread(_registry(request).load_policy, path, shown=body.path)
        except BundleInvalid as exc:
            # Nothing loadable there: the path is what to fix.
            exc.field = exc.field or "path"
            if exc.expected is None:
                exc.expected = "a bundle directory (holding manifest.json) or .rlsb archive in the repository"
            raise
    else:
        raise BadRequest("send JSON {\"path\": ...} or an archive as application/octet-stream",
                         field="Content-Type", expected=["application/json", "application/octet-stream"],
                         received=content_type)
    await _register(_registry(request), policy)
    _registry(request).seen[str(path)] = fingerprint(path)  # the repository poll need not try it again
    return _loaded(policy)


async def _register(registry: ModelRegistry, policy: Policy) -> None:
    try:
        registry.add(policy)  # 409 if that version is loaded; the old one keeps serving
    except ServiceError:
        await policy.close()  # never registered: nothing else would delete an upload's files
        raise


def _loaded(policy: Policy) -> JSONResponse:
    return JSONResponse(Loaded(name=policy.name, version=policy.version, current=True).model_dump(), status_code=201)


async def _load_upload(request: Request) -> JSONResponse:
    state = request.app.state
    limit = state.settings.max_body_bytes
    fd, tmp = tempfile.mkstemp(suffix=ARCHIVE_SUFFIX, prefix="upload-")
    try:
        size = 0
        with os.fdopen(fd, "wb") as fh:
            async for chunk in body_chunks(request.receive, limit, declared=request.headers.get("content-length")):
                size += len(chunk)
                fh.write(chunk)
        if size == 0:
            raise BadRequest("empty archive upload", field="body")
        # The bundle unpacks into its own temporary directory; the upload file can go.
        registry = _registry(request)
        try:
            policy = await asyncio.to_thread(registry.load_policy, Path(tmp), shown=UPLOAD, label=f"the {UPLOAD}")
        except BundleInvalid as exc:
            # The body is what to fix; ``received`` names the refused member when there is one.
            exc.field = exc.field or "body"  # or the manifest field refused (name, version)
            raise
        await _register(registry, policy)
        if state.settings.repository_poll_s > 0 and state.settings.repository is not None:
            # Replicas share the repository: the archive goes there so they load it too.
            await asyncio.to_thread(save_upload, registry, state.repository, Path(tmp), policy)
        return _loaded(policy)
    finally:
        os.unlink(tmp)


def resolve_in_repository(repository: Path, relative: str) -> Path:
    """``relative`` inside ``repository`` (symlinks resolved); 400 if it escapes it.

    Errors name the path as sent, never where the repository is on the server.
    """
    root = repository.resolve()
    try:
        candidate = (root / relative).resolve()
    except (OSError, ValueError) as exc:  # a name past NAME_MAX, a symlink loop
        # An OSError's text ends with the full path; its strerror says enough.
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise BadRequest(f"path {quoted(relative)} cannot be resolved: {reason}", field="path",
                         expected="a bundle path inside the model repository", received=relative) from None
    if not candidate.is_relative_to(root):
        raise PathOutsideRepository(f"path {quoted(relative)} resolves outside the model repository",
                                    field="path", expected="a path relative to the model repository, staying inside it",
                                    received=relative)
    return candidate


@router.delete("/models/{name}", response_model=Unloaded, summary="Unload every version of a model")
async def unload_model(name: str, request: Request) -> Unloaded:
    return Unloaded(name=name, versions=await _registry(request).remove(name))


@router.delete("/models/{name}/versions/{version}", response_model=Unloaded, summary="Unload one version")
async def unload_version(name: str, version: str, request: Request) -> Unloaded:
    return Unloaded(name=name, versions=await _registry(request).remove(name, version))


@router.put("/models/{name}/shadow", summary="Run a candidate on a live version's traffic (its answers never "
            "returned; its scores of logged steps go to the experience log's shadow/ table)",
            responses=errors(400, 404, 422, e422="The candidate's spaces differ from the live model's, or "
                                                 "queue_rows is not positive"),
            openapi_extra={"requestBody": {"required": True, "content": {
                "application/json": {"schema": body_schema(StartShadow)}}}})
async def start_shadow(name: str, request: Request) -> dict[str, Any]:
    body = await read_model(request, StartShadow)
    shadow = _registry(request).start_shadow(name, body.version, body.candidate.model, body.candidate.version,
                                             body.queue_rows)
    return shadow.describe()


@router.get("/models/{name}/shadow", summary="The model's shadow: candidate, queue, rows scored, dropped, skipped")
async def get_shadow(name: str, request: Request) -> dict[str, Any]:
    return _registry(request).shadows.get(name).describe()


@router.delete("/models/{name}/shadow", summary="Stop and remove the model's shadow")
async def delete_shadow(name: str, request: Request) -> dict[str, Any]:
    return _registry(request).shadows.delete(name).describe()
