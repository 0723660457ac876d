"""Read-only model listing and metadata."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from rlserve.service.api.openapi import errors
from rlserve.service.api.schemas import ModelList, ModelSummary, PolicySetSummary
from rlserve.service.serving.registry import ModelRegistry

router = APIRouter(tags=["models"])


def _registry(request: Request) -> ModelRegistry:
    return request.app.state.registry


@router.get("/v1/models", response_model=ModelList, summary="Loaded models and their versions")
async def list_models(request: Request) -> ModelList:
    registry = _registry(request)
    return ModelList(
        models=[ModelSummary(name=e.name, current_version=e.current, versions=list(e.versions))
                for e in registry.entries.values()],
        policy_sets=[PolicySetSummary(name=s.name, version=s.version, policies=s.members)
                     for s in registry.sets.values()],
    )


@router.get("/v1/models/{name}", responses=errors(404, e404="Unknown model"),
            summary="Metadata of a model's current version")
async def model_metadata(name: str, request: Request) -> dict[str, Any]:
    registry = _registry(request)
    if name in registry.sets:  # a policy set: its mapping and its members
        return registry.sets[name].metadata()
    entry = registry.entry(name)
    return {**entry.policy().metadata(), "current_version": entry.current, "versions": list(entry.versions)}


@router.get("/v1/models/{name}/versions/{version}", responses=errors(404, e404="Unknown model or version"),
            summary="Metadata of one version: spaces, config, state layout")
async def version_metadata(name: str, version: str, request: Request) -> dict[str, Any]:
    entry = _registry(request).entry(name)
    return {**entry.policy(version).metadata(), "current_version": entry.current, "versions": list(entry.versions)}
