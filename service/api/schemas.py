"""Pydantic request/response models of the non-hot routes (sessions, models, admin).

The act routes use the msgspec structs of ``rlserve.service.act.wire`` instead (decode speed); their
OpenAPI schema is generated from those structs.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints


class _Strict(BaseModel):
    # Unknown fields are errors, and no coercion: "1" or true is not a seed, 5 not an id.
    model_config = ConfigDict(extra="forbid", strict=True)


def _unicode(value: str) -> str:
    # JSON's "\ud800" escape yields a lone surrogate: not text, and not writable back as UTF-8.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("valid Unicode text (the string holds a lone surrogate escape)") from None
    return value


def _no_nul(value: str) -> str:
    if "\0" in value:
        raise ValueError("a path without NUL characters")
    return value


# Constraints inside the type (not on an optional field) so pydantic reports them as
# string_too_short / string_too_long with their bounds.
SessionId = Annotated[str, StringConstraints(min_length=1, max_length=128), AfterValidator(_unicode)]
Version = Annotated[str, AfterValidator(_unicode)]
BundlePath = Annotated[str, StringConstraints(max_length=4096), AfterValidator(_unicode), AfterValidator(_no_nul)]


class ErrorBody(BaseModel):
    code: str
    message: str
    field: str | None = None
    expected: Any = None
    received: Any = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class CreateSession(_Strict):
    session_id: SessionId | None = Field(
        None, description="Client-chosen id of 1..128 characters, any (percent-encode it in URLs); generated when absent")
    seed: int | None = Field(None, ge=0, description="Seeds the session's sampler so an episode replays")
    version: Version | None = Field(None, description="Bind to this version instead of the current one")


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
    path: BundlePath = Field(..., description="Bundle directory or .rlsb archive, relative to the model repository")


class Loaded(BaseModel):
    name: str
    version: str
    current: bool


class Unloaded(BaseModel):
    name: str
    versions: list[str]
