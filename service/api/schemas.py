"""Pydantic request/response models of the non-hot routes (sessions, models, admin).

The act routes use the msgspec structs of ``rlserve.service.act.wire`` instead (decode speed); their
OpenAPI schema is generated from those structs.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
)


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


def _whole(value: Any) -> Any:
    # JSON Schema counts 2.0 as the integer 2: the documented "integer" takes it (strict
    # validation alone would refuse every float); 2.5 and 1e400 stay refused.
    return int(value) if isinstance(value, float) and value.is_integer() else value


# Constraints inside the type (not on an optional field) so pydantic reports them as
# string_too_short / string_too_long with their bounds.
SessionId = Annotated[str, StringConstraints(min_length=1, max_length=128), AfterValidator(_unicode)]
Text = Annotated[str, AfterValidator(_unicode)]  # a string that can be written back as UTF-8
Version = Text
BundlePath = Annotated[str, StringConstraints(max_length=4096), AfterValidator(_unicode), AfterValidator(_no_nul)]
Seed = Annotated[int, Field(ge=0, le=2**64 - 1), BeforeValidator(_whole)]  # a session record keeps 64 bits


class ErrorBody(BaseModel):
    code: str
    message: str
    field: str | None = None
    expected: Any = None
    received: Any = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class Readiness(BaseModel):
    ready: bool
    models: dict[str, str] = Field(description="Each loaded model's current version")
    failed_to_load: dict[str, str] = Field(description="Bundle path -> why it did not load at start")
    error: ErrorBody | None = Field(None, description="Why not ready (only when not ready)")


class CreateSession(_Strict):
    session_id: SessionId | None = Field(
        None,
        description="Client-chosen id of 1..128 characters, any (percent-encode it in URLs); generated when absent",
    )
    seed: Seed | None = Field(None, description="Seeds the session's sampler so an episode replays")
    version: Version | None = Field(None, description="Bind to this version instead of the current one")


class SessionInfo(BaseModel):
    session_id: str
    model: str
    version: str
    seed: int | None
    steps: int
    idle_s: float
    idle_ttl_s: float


class CreateEpisode(_Strict):
    episode_id: SessionId | None = Field(
        None, description="Client-chosen id of 1..128 characters (percent-encode it in URLs); generated when absent")
    seed: Seed | None = Field(None, description="Seeds the episode's samplers (each agent's derived from it), so "
                                                "it replays")


class EpisodeAgent(BaseModel):
    policy: str
    model: str = Field(description="The member model holding the agent's state (<set>.<policy>)")
    version: str | None
    session_id: str = Field(description="The agent's session in that model")
    steps: int | None = Field(description="Steps the agent took (null: its state expired)")


class EpisodeInfo(BaseModel):
    episode_id: str
    model: str
    version: str
    seed: int | None
    steps: int = Field(description="Act requests of the episode answered")
    idle_s: float
    idle_ttl_s: float
    agents: dict[str, EpisodeAgent] = Field(description="The agents with state in the episode")


class ModelSummary(BaseModel):
    name: str
    current_version: str
    versions: list[str]


class PolicySetSummary(BaseModel):
    name: str
    version: str
    policies: dict[str, str] = Field(description="Policy id -> the member model serving it (<set>.<policy>)")


class ModelList(BaseModel):
    models: list[ModelSummary]
    policy_sets: list[PolicySetSummary] = Field(default_factory=list,
                                                description="Multi-agent policy sets (act at .../agents/act)")


# What the document can say of "inside the repository" (symlinks it cannot): relative, no
# '..' segment, no NUL. The server checks the resolved path itself (400 when outside).
_RELATIVE_PATH = r"^(?!/)(?!(?:[\s\S]*/)?\.\.(?:/|$))[^\u0000]*$"


class LoadFromPath(_Strict):
    path: BundlePath = Field(..., description="Bundle directory or .rlsb archive, relative to the model repository",
                             json_schema_extra={"pattern": _RELATIVE_PATH})


class Loaded(BaseModel):
    name: str
    version: str
    current: bool


class Unloaded(BaseModel):
    name: str
    versions: list[str]


class ShadowCandidate(_Strict):
    model: Text = Field(..., description="A loaded model: the live one (another version) or one with the same spaces")
    version: Version | None = Field(None, description="Its version (default: its current one)")


class StartShadow(_Strict):
    candidate: ShadowCandidate
    version: Version | None = Field(None, description="The live version shadowed (default: the current one)")
    queue_rows: int = Field(4096, description="Rows waiting for the candidate; past this, rows are dropped "
                                              "(counted) and their sessions skipped until their next episode")
