"""What flows from the recorder to the writer: a model's part of the log, transitions and
delayed rewards."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
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


class Transition(msgspec.Struct, gc=False):
    """Step t (``step``) closed by step t+1's observation, reward and end.

    Not tracked by the garbage collector (nor is a ``Trail``; their values are packed, see
    ``packer``): thousands wait for the writer at a time, and tracked objects that survive
    make the collector's passes, which pause the event loop, grow with them."""

    step: Trail
    next_obs: Any
    reward: float
    end: int  # 0, TERMINATED or TRUNCATED


def packer(space: Any) -> Callable[[Any], Any]:
    """How the recorder keeps a value of ``space``: a Box (or MultiDiscrete, MultiBinary) as
    the raw bytes of its dtype (int64 for the discrete ones), in C order; other values as
    they came (JSON values). ``spaces.stack`` turns many of them into one array."""
    if isinstance(space, gs.Box):
        dtype = np.dtype(space.dtype)
        if dtype == np.float32 and len(space.shape) == 1:
            return lambda value: array("f", value).tobytes() if isinstance(value, list) else _raw(value, dtype)
        return lambda value: _raw(value, dtype)
    if isinstance(space, gs.MultiDiscrete | gs.MultiBinary):
        return lambda value: _raw(value, np.dtype(np.int64))
    return as_is


def as_is(value: Any) -> Any:
    """The packer of a value kept as it came (a JSON value)."""
    return value


def plain_row_bytes(space: Any) -> int:
    """The bytes of a flat float32 Box observation (what ``packer`` keeps of a list of its
    floats), 0 for other spaces: the recorder slices such rows out of the batch's own array."""
    if isinstance(space, gs.Box) and np.dtype(space.dtype) == np.float32 and len(space.shape) == 1:
        return 4 * int(space.shape[0])
    return 0


def _raw(value: Any, dtype: np.dtype) -> bytes:
    return np.ascontiguousarray(value, dtype=dtype).tobytes()


class ShadowScore(msgspec.Struct, gc=False):
    """What a shadow candidate computed for one logged step (``event_id``): the logp of the
    action actually taken in its own distribution, its own action (packed, see ``packer``)
    and its dist inputs (float32 bytes). Written to ``shadow/`` (``tables.shadow_table``)."""

    event_id: str
    candidate: str  # "<model>@<version>"
    logp: float  # NaN where the candidate's distribution defines none
    action: Any
    dist_inputs: bytes  # (N,) float32
    time: float


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


class Fields:
    """Transitions a field at a time, for the writer's tables: one list per field, and no
    object per cell (a tuple or dict per row would be thousands of objects the garbage
    collector scans again at each pass while a table is built)."""

    def __init__(self, rows: list[Transition]):
        steps = [r.step for r in rows]
        self.next_obs = [r.next_obs for r in rows]
        self.reward = [r.reward for r in rows]
        self.end = [r.end for r in rows]
        self.eps_id = [s.eps_id for s in steps]
        self.t = [s.t for s in steps]
        self.event_id = [s.event_id for s in steps]
        self.obs = [s.obs for s in steps]
        self.action = [s.action for s in steps]
        self.logp = [s.logp for s in steps]
        self.value = [s.value for s in steps]
        self.explore = [s.explore for s in steps]
        self.version = [s.version for s in steps]
        self.time = [s.time for s in steps]
        env_action = [s.env_action for s in steps]  # None: as ``action`` (no unsquash or clip)
        self.env_action = self.action if env_action.count(None) == len(env_action) else [
            a if e is None else e for a, e in zip(self.action, env_action, strict=True)]
        self.agent_id = [s.agent_id for s in steps]
        self.module_id = [s.module_id for s in steps]
