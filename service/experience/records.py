"""What flows from the recorder to the writer: a model's part of the log, transitions and
delayed rewards."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces as gs

from rlserve.service.experience.trail import Trail

TERMINATED, TRUNCATED = 1, 2  # ``Transition.end``; 0: the episode goes on


@dataclass(frozen=True, eq=False)
class ModelLog:
    """One model's part of the log: its name, spaces and folder."""

    name: str
    obs_space: Any
    action_space: Any
    directory: Path  # <log root>/<model>, holding columns/, episodes/ and rewards/


@dataclass(slots=True)
class Transition:
    """Step t (``step``) closed by step t+1's observation, reward and end."""

    step: Trail
    next_obs: Any
    reward: float
    end: int  # 0, TERMINATED or TRUNCATED


@dataclass(slots=True)
class RewardEvent:
    """A reward or correction for a logged step (``event_id``), reported later."""

    event_id: str
    reward: float
    mode: str  # "add" to the step's reward, or "replace" it
    time: float


def row_bytes(model: ModelLog) -> int:
    """About what one transition costs in memory and on disk (for the size roll)."""
    return 2 * value_bytes(model.obs_space) + 2 * value_bytes(model.action_space) + 160


def value_bytes(space: Any) -> int:
    """About how many bytes one value takes (for the size roll)."""
    if isinstance(space, gs.Box):
        return int(np.prod(space.shape, dtype=np.int64)) * np.dtype(space.dtype).itemsize
    if isinstance(space, gs.MultiDiscrete | gs.MultiBinary):
        return 8 * int(np.prod(space.shape, dtype=np.int64))
    return 64
