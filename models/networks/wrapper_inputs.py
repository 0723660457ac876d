"""What the LSTM and attention wrappers add to the wrapped model: previous actions.

Previous actions arrive as flattened raw actions (Discrete = 1 column holding the index,
MultiDiscrete = k columns, Box/MultiBinary = prod(shape) columns, Tuple/Dict = the leaves
in flattened order with Dict keys sorted). ``PrevActionEncoder`` one-hot encodes the
discrete columns *inside the graph* with a constant gather + compare, so the model traces
and exports with no data-dependent shapes (``F.one_hot`` would need the class count from
the data).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import gymnasium.spaces as gs
import numpy as np
import torch
from torch import nn

from models.spaces import Simplex


@dataclass(frozen=True)
class _Column:
    """One encoded column: a copy of input column ``src`` or the test ``src == value``."""

    src: int
    onehot_value: int = -1  # -1: raw copy


@functools.singledispatch
def _encode_columns(space: gs.Space, offset: int) -> tuple[list[_Column], int]:
    """-> (encoded columns, input columns consumed) for ``space`` starting at ``offset``."""
    raise ValueError(
        f"previous actions: unsupported action space {type(space).__name__}; expected Discrete, "
        "MultiDiscrete, Box, MultiBinary, Simplex or a Tuple/Dict of these"
    )


@_encode_columns.register
def _(space: gs.Discrete, offset: int) -> tuple[list[_Column], int]:
    return [_Column(offset, k) for k in range(int(space.n))], 1


@_encode_columns.register
def _(space: gs.MultiDiscrete, offset: int) -> tuple[list[_Column], int]:
    nvec = np.asarray(space.nvec).ravel()
    cols = [_Column(offset + i, k) for i, n in enumerate(nvec) for k in range(int(n))]
    return cols, len(nvec)


def _raw(width: int, offset: int) -> tuple[list[_Column], int]:
    return [_Column(offset + i) for i in range(width)], width


@_encode_columns.register
def _(space: gs.Box, offset: int) -> tuple[list[_Column], int]:
    return _raw(int(np.prod(space.shape)), offset)


@_encode_columns.register
def _(space: gs.MultiBinary, offset: int) -> tuple[list[_Column], int]:
    return _raw(int(np.prod(space.shape)), offset)


@_encode_columns.register
def _(space: Simplex, offset: int) -> tuple[list[_Column], int]:
    return _raw(int(np.prod(space.shape)), offset)


def _encode_children(children: list[gs.Space], offset: int) -> tuple[list[_Column], int]:
    cols: list[_Column] = []
    used = 0
    for child in children:
        child_cols, child_used = _encode_columns(child, offset + used)
        cols += child_cols
        used += child_used
    return cols, used


@_encode_columns.register
def _(space: gs.Tuple, offset: int) -> tuple[list[_Column], int]:
    return _encode_children(list(space.spaces), offset)


@_encode_columns.register
def _(space: gs.Dict, offset: int) -> tuple[list[_Column], int]:
    # RLlib flattens actions with dm-tree, which visits dict keys in sorted order.
    return _encode_children([space.spaces[k] for k in sorted(space.spaces)], offset)


class PrevActionEncoder(nn.Module):
    """``(..., A)`` flattened raw actions -> ``(..., W)`` with discrete leaves one-hot.

    ``in_width`` is A (the flat action width), ``out_width`` is W (what RLlib calls
    ``action_dim``: n for Discrete, sum(nvec) for MultiDiscrete, prod(shape) for Box).
    Discrete values are truncated toward zero like RLlib's ``.long()``; an index outside
    the space encodes as an all-zero row instead of raising.
    """

    def __init__(self, action_space: gs.Space) -> None:
        super().__init__()
        cols, self.in_width = _encode_columns(action_space, 0)
        self.out_width = len(cols)
        # Non-persistent: derived from the space, so they stay out of the state_dict.
        self.register_buffer(
            "_src", torch.tensor([c.src for c in cols], dtype=torch.long), persistent=False
        )
        values = torch.tensor([float(c.onehot_value) for c in cols], dtype=torch.float32)
        self.register_buffer("_value", values, persistent=False)
        self.register_buffer("_is_onehot", values >= 0, persistent=False)
        self._all_raw = not any(c.onehot_value >= 0 for c in cols)

    def forward(self, actions: torch.Tensor) -> torch.Tensor:
        actions = actions.to(torch.float32)
        if self._all_raw:
            return actions
        picked = actions.index_select(-1, self._src)
        onehot = (torch.trunc(picked) == self._value).to(torch.float32)
        return torch.where(self._is_onehot, onehot, picked)


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
