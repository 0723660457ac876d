"""Pydantic request/response models of the non-hot routes (sessions, models, admin).

The act routes use the msgspec structs of ``service.wire`` instead (decode speed); their
OpenAPI schema is generated from those structs.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorBody(BaseModel):
    code: str
    message: str
    field: str | None = None
    expected: Any = None
    received: Any = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class CreateSession(_Strict):
    session_id: str | None = Field(None, min_length=1, max_length=128, description="Client-chosen id; generated when absent")
    seed: int | None = Field(None, ge=0, description="Seeds the session's sampler so an episode replays")
    version: str | None = Field(None, description="Bind to this version instead of the current one")


class SessionInfo(BaseModel):
    session_id: str
    model: str
    version: str
    seed: int | None
    steps: int
    idle_s: float
    idle_ttl_s: float


class ModelSummary(BaseModel):
    name: str
    current_version: str
    versions: list[str]


class ModelList(BaseModel):
    models: list[ModelSummary]


class LoadFromPath(_Strict):
    path: str = Field(..., description="Bundle directory or .rlsb archive, relative to the model repository")


class Loaded(BaseModel):
    name: str
    version: str
    current: bool


class Unloaded(BaseModel):
    name: str
    versions: list[str]
