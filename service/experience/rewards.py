"""Delayed rewards: a reward (or a correction) for a logged step, named by its event id.

Some environments know a step's reward only later (a purchase a day after the
recommendation), or never report it with the next observation. Every logged step's answer
carries an ``event_id``; ``POST /v1/models/{name}/experience/rewards`` takes rewards for
such ids, and the writer stores them beside the transitions (``rewards/``). The log's
reader (``rlserve experience``) joins them: ``add`` adds to the step's reward, ``replace``
replaces it (the last ``replace`` wins, then every ``add`` counts).
"""

from __future__ import annotations

import math
import time
from typing import Any, Literal

from rlserve.service.errors import BadRequest, NotFound, QueueFull, quoted
from rlserve.service.experience.records import RewardEvent

Mode = Literal["add", "replace"]
MODES = ("add", "replace")
MAX_EVENT_ID = 256


def reward_events(items: list[Any], now: float | None = None) -> list[RewardEvent]:
    """Validated ``RewardEvent``s from the route's items (``event_id``, ``reward``, ``mode``)."""
    when = time.time() if now is None else now
    events = []
    for index, item in enumerate(items):
        field = f"rewards[{index}]"
        if not 0 < len(item.event_id) <= MAX_EVENT_ID:
            raise BadRequest(f"{field}.event_id: the event_id of an act answer", field=f"{field}.event_id",
                             expected=f"a string of 1..{MAX_EVENT_ID} characters", received=item.event_id)
        if not math.isfinite(item.reward):
            raise BadRequest(f"{field}.reward must be finite", field=f"{field}.reward", expected="a finite number",
                             received=str(item.reward))
        events.append(RewardEvent(item.event_id, float(item.reward), item.mode, when))
    return events


def accept_rewards(experience: Any, model: str, items: list[Any]) -> int:
    """Queue ``items`` for ``model``'s log; how many were taken. 404 when the log does not
    record the model, 503 when the writer's queue is full (nothing was taken)."""
    if experience is None or experience.model_log(model) is None:
        raise NotFound(f"the experience log does not record model {quoted(model)} on this server "
                       "(RLSERVE_EXPERIENCE_LOG, RLSERVE_EXPERIENCE_MODELS)", field="name", received=model)
    events = reward_events(items)
    if not experience.rewards(model, events):
        raise QueueFull("the experience log's queue is full; retry later", headers={"Retry-After": "1"})
    return len(events)
