"""A request's rows: the one shape the step layer sees, whatever form the request had."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(slots=True)
class Rows:
    """One request as per-row lists (length B); ``single`` remembers the form.

    The ``has_*`` flags let the common plain request skip the per-row field checks.
    ``decoded`` marks observations another wire format already decoded and validated
    against the observation space (``rlserve.service.step.columns``): a stacked
    ``(B, *shape)`` array for a simple space, one structured value per row otherwise.
    """

    single: bool
    observations: list[Any] | np.ndarray
    session_ids: list[str | None]
    episode_starts: list[bool]
    rewards: list[float | None]
    prev_actions: list[Any]  # msgspec.UNSET where not reported
    action_masks: list[Any]  # None where not given
    seeds: list[int | None]
    has_sessions: bool = True
    has_rewards: bool = True
    has_prev_actions: bool = True
    has_masks: bool = True
    decoded: bool = False
    windows: list[Any] | None = None  # trajectory windows sent by stateless rows (None where not sent)
    # Per row: the episode ends with this observation, 1 terminated, 2 truncated, 0 not
    # (None: no row ends one). Only the experience log reads it.
    ends: list[int] | None = None
    # A policy set's part (``rlserve.service.multiagent``): each row's agent id, and the policy
    # id of the set that answers them (None: a single-agent request). Only the experience log
    # reads them.
    agents: list[str] | None = None
    module_id: str | None = None

    def __len__(self) -> int:
        return len(self.observations)
