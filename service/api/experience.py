"""The experience log's route: delayed rewards for logged steps (thin; the use case is
``rlserve.service.experience.rewards``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from rlserve.service.api.bodies import read_model
from rlserve.service.api.openapi import body_schema, errors
from rlserve.service.api.schemas import Text
from rlserve.service.experience.rewards import Mode, accept_rewards

router = APIRouter(tags=["experience"])


class Reward(BaseModel):
    # strict: "1.5" or true is not a reward (a JSON number is; 2 is taken as 2.0)
    model_config = ConfigDict(extra="forbid", strict=True)

    # Text: JSON's "\ud800" is no text; the rewards file could not hold it, nor its neighbours.
    event_id: Text = Field(description="The event_id of the act answer whose step earned it")
    reward: float = Field(description="A finite JSON number")
    mode: Mode = Field("add", description="add: added to the step's reward; replace: replaces it")


class Rewards(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rewards: list[Reward] = Field(min_length=1)


class Accepted(BaseModel):
    accepted: int


_BODY = {"requestBody": {"required": True,
                         "content": {"application/json": {"schema": body_schema(Rewards)}}}}


@router.post("/v1/models/{name}/experience/rewards", status_code=202, response_model=Accepted,
             openapi_extra=_BODY,
             responses=errors(400, 404, 413, 503, e404="The experience log does not record this model here",
                              e503="The experience log's queue is full (see Retry-After)"),
             summary="Report rewards (or corrections) for logged steps, by their act answers' event_id")
async def post_rewards(name: str, request: Request) -> Accepted:
    body = await read_model(request, Rewards)
    return Accepted(accepted=accept_rewards(request.app.state.experience, name, body.rewards))
