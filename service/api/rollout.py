"""Admin API for rolling out a version: the traffic split, promotion, rollback, the guard,
and the per-version live results (docs/rollout.md). Same auth as every admin route.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.security import HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

from rlserve.service.api.admin import require_admin
from rlserve.service.api.bodies import body_limit, parse_json, read_body
from rlserve.service.api.openapi import errors
from rlserve.service.errors import BadRequest, quoted
from rlserve.service.serving.registry import ModelEntry, ModelRegistry
from rlserve.service.serving.traffic import MAX_WEIGHT, check_guard, check_weights

MAX_REASON = 256


class _Body(BaseModel):  # the documented bodies (OpenAPI); the routes read them by hand, naming the field
    model_config = ConfigDict(extra="forbid", strict=True)
    reason: str | None = Field(None, max_length=MAX_REASON)


class TrafficBody(_Body):
    weights: dict[str, float] = Field(min_length=1, description="version -> weight (>= 0, a positive sum)")


class PromoteBody(_Body):
    version: str


class GuardBody(_Body):
    margin: float = Field(ge=0, le=MAX_WEIGHT, description="how far below the baseline's mean return, absolute")
    min_episodes: int = Field(ge=1, le=1_000_000_000)


def _documented(model: type[BaseModel], required: bool = True) -> dict[str, Any]:
    schema = model.model_json_schema()
    if model is TrafficBody:  # each weight >= 0 and finite
        schema["properties"]["weights"]["additionalProperties"] = {"type": "number", "minimum": 0,
                                                                   "maximum": MAX_WEIGHT}
    return {"requestBody": {"required": required, "content": {"application/json": {"schema": schema}}}}

router = APIRouter(prefix="/v1/admin/models/{name}", tags=["admin"],
                   dependencies=[Depends(HTTPBearer(auto_error=False, description="RLSERVE_ADMIN_TOKEN")),
                                 Depends(require_admin)],
                   responses=errors(401, 403, 404, e404="The admin API is disabled (no RLSERVE_ADMIN_TOKEN), "
                                                        "or an unknown model or version"))


def _entry(request: Request, name: str) -> ModelEntry:
    registry: ModelRegistry = request.app.state.registry
    return registry.entry(name)


async def _body(request: Request, keys: set[str], required: frozenset[str] = frozenset()) -> dict[str, Any]:
    raw = await read_body(request, body_limit(request))
    body = parse_json(raw) if raw.strip() else {}
    if not isinstance(body, dict):
        raise BadRequest("the body is a JSON object", field="body", expected="a JSON object", received=body)
    for key in body:
        if key not in keys:
            raise BadRequest(f"unknown field {quoted(key)}", field=str(key)[:64], expected=sorted(keys), received=key)
    for key in required:
        if key not in body:
            raise BadRequest(f"{key} is required", field=key, expected=f"the field {key!r}", received=None)
    return body


def _reason(body: dict[str, Any], default: str) -> str:
    reason = body.get("reason")
    if reason is None:
        return default
    if not isinstance(reason, str) or len(reason) > MAX_REASON or not _is_text(reason):
        raise BadRequest(f"reason: a string of at most {MAX_REASON} characters", field="reason",
                         expected=f"valid Unicode text of at most {MAX_REASON} characters", received=reason)
    return reason


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")  # a lone surrogate escape is no text: it could not be written back
    except UnicodeEncodeError:
        return False
    return True


@router.get("/traffic", summary="The split of new episodes between the model's versions")
async def get_traffic(name: str, request: Request) -> dict[str, Any]:
    return _entry(request, name).traffic.as_json()


@router.put("/traffic", summary="Set the split: {'weights': {'1': 90, '2': 10}} (live episodes stay where they are)",
            responses=errors(400, 422, e422="The weights sum to 0"), openapi_extra=_documented(TrafficBody))
async def put_traffic(name: str, request: Request) -> dict[str, Any]:
    entry = _entry(request, name)
    body = await _body(request, {"weights", "reason"}, frozenset({"weights"}))
    weights = check_weights(body["weights"], entry.versions, name)
    entry.traffic.set_weights(weights, _reason(body, "admin API"))
    return entry.traffic.as_json()


@router.post("/promote", summary="Promote a version: every new episode goes to it (live ones finish on theirs)",
             responses=errors(400), openapi_extra=_documented(PromoteBody))
async def promote(name: str, request: Request) -> dict[str, Any]:
    entry = _entry(request, name)
    body = await _body(request, {"version", "reason"}, frozenset({"version"}))
    version = body["version"]
    if not isinstance(version, str):
        raise BadRequest("version: a version string", field="version", expected=list(entry.versions),
                         received=version)
    entry.traffic.promote(version, _reason(body, "admin API"))
    return entry.traffic.as_json()


@router.post("/rollback", summary="Restore the traffic state before the last change", responses=errors(400, 409),
             openapi_extra=_documented(_Body, required=False))
async def rollback(name: str, request: Request) -> dict[str, Any]:
    entry = _entry(request, name)
    body = await _body(request, {"reason"})
    entry.traffic.rollback(_reason(body, "admin API"))
    return entry.traffic.as_json()


@router.put("/guard", summary="Set the rollback guard: {'margin': return, 'min_episodes': n}", responses=errors(400),
            openapi_extra=_documented(GuardBody))
async def put_guard(name: str, request: Request) -> dict[str, Any]:
    entry = _entry(request, name)
    body = await _body(request, {"margin", "min_episodes", "reason"})
    reason = _reason(body, "admin API")
    body.pop("reason", None)
    entry.traffic.set_guard(check_guard(body), reason)
    return entry.traffic.as_json()


@router.delete("/guard", summary="Remove the rollback guard")
async def delete_guard(name: str, request: Request) -> dict[str, Any]:
    entry = _entry(request, name)
    entry.traffic.set_guard(None, "admin API: guard removed")
    return entry.traffic.as_json()


# Not under /versions/: /versions/{version} is one version's (a version may be named "summary").
@router.get("/summary", summary="Per-version live results, the split and its changes")
async def summary(name: str, request: Request) -> dict[str, Any]:
    entry = _entry(request, name)
    registry: ModelRegistry = request.app.state.registry
    return {**entry.traffic.as_json(), "versions": registry.live.summary(name, list(entry.versions)),
            "changes": list(entry.traffic.changes)}
