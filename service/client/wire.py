"""What goes over the wire: act request bodies built from keyword arguments, and answers.

``ActResult`` is the client's view of one act answer; the body builders leave out every
field that was not given, so the server applies its defaults.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ActResult"]


@dataclass
class ActResult:
    """One act answer: single form fills ``action``/``logp``; batch form ``actions``/``logps``."""

    model: str
    version: str
    raw: dict[str, Any]
    action: Any = None
    logp: float | None = None
    actions: list[Any] = field(default_factory=list)
    logps: list[float | None] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ActResult:
        """The result of an act answer's JSON body (single or batch form)."""
        result = cls(model=data["model"], version=data["version"], raw=data)
        if "action" in data:
            result.action, result.logp = data["action"], data.get("logp")
        if "actions" in data:
            result.actions, result.logps = data["actions"], list(data.get("logp") or [])
        return result

    @property
    def value(self) -> Any:
        """The value estimate(s), when the request asked for ``outputs=["value"]``; else None."""
        return self.raw.get("value")

    @property
    def entropy(self) -> Any:
        """The distribution's entropy (one per row), when asked for with ``outputs=["entropy"]``; else None."""
        return self.raw.get("entropy")


@dataclass
class _Episode:
    session_id: str
    pending_reward: float | None = None
    pending_action: Any = None
    has_pending_action: bool = False
    started: bool = True
    total_reward: float = 0.0


def _act_body(observation: Any, *, session_id: str | None, explore: bool | None,
              reward: float | None, prev_action: Any, has_prev_action: bool, episode_start: bool,
              action_mask: Any, seed: int | None, outputs: Sequence[str] | None,
              extra: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"observation": observation}
    if session_id is not None:
        body["session_id"] = session_id
    if explore is not None:
        body["explore"] = explore
    if reward is not None:
        body["reward"] = reward
    if has_prev_action:
        body["prev_action"] = prev_action
    if episode_start:
        body["episode_start"] = True
    if action_mask is not None:
        body["action_mask"] = action_mask
    if seed is not None:
        body["seed"] = seed
    if outputs:
        body["outputs"] = list(outputs)
    if extra:
        body.update(extra)
    return body


def _batch_body(observations: Sequence[Any], *, session_ids: Sequence[str | None] | None,
                explore: bool | None, rewards: Sequence[float | None] | None,
                episode_starts: Sequence[bool] | None, action_masks: Sequence[Any] | None,
                outputs: Sequence[str] | None, extra: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"observations": list(observations)}
    for key, value in (("session_ids", session_ids), ("rewards", rewards),
                       ("episode_starts", episode_starts), ("action_masks", action_masks)):
        if value is not None:
            body[key] = list(value)
    if explore is not None:
        body["explore"] = explore
    if outputs:
        body["outputs"] = list(outputs)
    if extra:
        body.update(extra)
    return body
