"""``ObservationError``: a structured observation that does not fit its space.

The message names where (``obs.sensors[2].b``), what the space expects and what came,
so an API edge can hand it to a client unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces as gs

from rlserve.models.spaces import Repeated, Simplex

__all__ = ["ObservationError", "describe_space", "describe_value"]


class ObservationError(ValueError):
    """``path``: where in the observation; ``expected``: the space; ``received``: what came."""

    def __init__(self, path: str, expected: str, received: str):
        self.path = path
        self.expected = expected
        self.received = received
        super().__init__(f"{path}: expected {expected}, got {received}")


def describe_space(space: gs.Space) -> str:
    """A short, human description of a space (not its full repr: bounds can be huge)."""
    if isinstance(space, gs.Discrete):
        start = int(space.start)
        return f"Discrete(n={int(space.n)}): an integer in [{start}, {start + int(space.n) - 1}]"
    if isinstance(space, gs.MultiDiscrete):
        return f"MultiDiscrete(nvec={space.nvec.tolist()}, start={space.start.tolist()}): integers"
    if isinstance(space, gs.MultiBinary):
        return f"MultiBinary of shape {tuple(space.shape)}: 0/1 values"
    if isinstance(space, Simplex):
        return f"Simplex of shape {tuple(space.shape)}"
    if isinstance(space, gs.Box):
        return f"Box({np.dtype(space.dtype).name}, shape={tuple(space.shape)})"
    if isinstance(space, gs.Tuple):
        return f"Tuple of {len(space.spaces)} elements"
    if isinstance(space, gs.Dict):
        return "Dict with keys " + ", ".join(repr(k) for k in space.spaces)
    if isinstance(space, Repeated):
        return f"Repeated list of at most {space.max_len} items"
    return type(space).__name__


def describe_value(value: Any) -> str:
    """Type, and shape/dtype or a short repr, of what was received."""
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            return f"numpy {value.dtype.name} scalar {value.item()!r}"
        return f"array of shape {value.shape} and dtype {value.dtype.name}"
    if isinstance(value, list | tuple):
        return f"{type(value).__name__} of length {len(value)}"
    if isinstance(value, dict):
        return f"dict with keys {sorted(map(str, value))}"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"
