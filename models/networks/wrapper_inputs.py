"""What the LSTM and attention wrappers add to the wrapped model: previous actions (and
the checks of their integer config keys).

Previous actions arrive as flattened raw actions (Discrete = 1 column holding the index,
MultiDiscrete = k columns, Box/MultiBinary = prod(shape) columns, Tuple/Dict = the leaves
in flattened order with Dict keys sorted). ``PrevActionEncoder`` one-hot encodes the
discrete columns *inside the graph* by comparing each with ``arange(n)`` (n fixed by the
space), so the model traces and exports with no data-dependent shapes (``F.one_hot``
takes the class count as data) and carries no buffers that a weight file would lack.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium.spaces as gs
import numpy as np
import torch
from torch import nn

from rlserve.models.spaces import Simplex, shape_of


def positive_int(cfg: Mapping[str, Any], key: str, where: str = "model_config") -> int:
    """``cfg[key]`` if it is an int >= 1 (not a bool), else a ValueError naming ``where.key``."""
    value = cfg[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{where}.{key}: expected a positive int, received {value!r}")
    return value


def non_negative_int(cfg: dict[str, Any], key: str) -> int:
    """``cfg[key]`` (unset/None counts as 0) if it is an int >= 0, else a ValueError."""
    value = cfg.get(key) or 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"model_config.{key}: expected an int >= 0, received {value!r}")
    return value


@dataclass(frozen=True)
class _Segment:
    """Input columns ``[start, start + width)``: raw, or (width 1) one-hot over ``classes``."""

    start: int
    width: int = 1
    classes: int = 0  # 0: raw copy


@functools.singledispatch
def _segments(space: gs.Space, offset: int) -> tuple[list[_Segment], int]:
    """-> (segments, input columns consumed) for ``space`` starting at column ``offset``."""
    raise ValueError(
        f"previous actions: unsupported action space {type(space).__name__}; expected Discrete, "
        "MultiDiscrete, Box, MultiBinary, Simplex or a Tuple/Dict of these"
    )


@_segments.register
def _(space: gs.Discrete, offset: int) -> tuple[list[_Segment], int]:
    return [_Segment(offset, 1, int(space.n))], 1


@_segments.register
def _(space: gs.MultiDiscrete, offset: int) -> tuple[list[_Segment], int]:
    nvec = np.asarray(space.nvec).ravel()
    return [_Segment(offset + i, 1, int(n)) for i, n in enumerate(nvec)], len(nvec)


def _raw(space: gs.Space, offset: int) -> tuple[list[_Segment], int]:
    width = int(np.prod(shape_of(space)))
    return [_Segment(offset, width)], width


for _raw_type in (gs.Box, gs.MultiBinary, Simplex):
    _segments.register(_raw_type, _raw)


def _children(children: list[gs.Space], offset: int) -> tuple[list[_Segment], int]:
    segments: list[_Segment] = []
    used = 0
    for child in children:
        child_segments, child_used = _segments(child, offset + used)
        segments += child_segments
        used += child_used
    return segments, used


@_segments.register
def _(space: gs.Tuple, offset: int) -> tuple[list[_Segment], int]:
    return _children(list(space.spaces), offset)


@_segments.register
def _(space: gs.Dict, offset: int) -> tuple[list[_Segment], int]:
    # RLlib flattens actions with dm-tree, which visits dict keys in sorted order.
    return _children([space.spaces[k] for k in sorted(space.spaces)], offset)


class PrevActionEncoder(nn.Module):
    """``(..., A)`` flattened raw actions -> ``(..., W)`` with discrete leaves one-hot.

    ``in_width`` is A (the flat action width), ``out_width`` is W (what RLlib calls
    ``action_dim``: n for Discrete, sum(nvec) for MultiDiscrete, prod(shape) for Box).
    Discrete values are truncated toward zero like RLlib's ``.long()``; an index outside
    the space encodes as an all-zero row instead of raising.
    """

    def __init__(self, action_space: gs.Space) -> None:
        super().__init__()
        self._parts, self.in_width = _segments(action_space, 0)
        self.out_width = sum(p.classes or p.width for p in self._parts)

    def forward(self, actions: torch.Tensor) -> torch.Tensor:
        actions = actions.to(torch.float32)
        if all(p.classes == 0 for p in self._parts):
            return actions
        encoded = []
        for part in self._parts:
            columns = actions[..., part.start : part.start + part.width]
            if part.classes:
                classes = torch.arange(part.classes, dtype=torch.float32, device=actions.device)
                columns = (torch.trunc(columns) == classes).to(torch.float32)
            encoded.append(columns)
        return torch.cat(encoded, dim=-1)


class _ShadowedValueHead(nn.Module):
    """Stands in for the wrapped model's ``_value_branch`` (its output is never used).

    RLlib's wrappers inherit from the wrapped model and assign their own ``_value_branch``,
    which replaces the wrapped model's head: RLlib's state_dict has only the wrapper's.
    Swapping in this parameter-free stub keeps our keys identical and skips the dead matmul.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(x.shape[:-1] + (1,))


def shadow_base_value_head(base: nn.Module) -> None:
    """Drop the wrapped model's ``_value_branch`` the way RLlib's wrapper overrides it."""
    if isinstance(getattr(base, "_value_branch", None), nn.Module):
        base._value_branch = _ShadowedValueHead()


def base_features(base: nn.Module, obs: torch.Tensor) -> torch.Tensor:
    """The wrapped model's output (built with num_outputs=None): ``(B, base.num_outputs)``.

    Prefers ``forward_out`` (output only) when the base offers it: the wrapper has its own
    value head, so the base's value computation would be dead work.
    """
    forward_out = getattr(base, "forward_out", None)
    out = forward_out(obs) if callable(forward_out) else base(obs)[0]
    return out.to(torch.float32)
