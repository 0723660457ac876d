"""RLlib's ``FlattenObservations`` connector in numpy (``flatten_inputs_to_1d_tensor``).

One row becomes one float32 vector, the leaves in dm-tree order: **Dict keys sorted**
(whatever order the space lists them in), Tuple entries in order; Discrete -> one-hot of
the value (n wide), MultiDiscrete -> the one-hots of its entries side by side, Box and
MultiBinary -> raveled (C order) and cast to float32. This differs from the old stack's
preprocessors, which special-case some Box shapes (Atari RAM, pixels) and keep a Dict's own
key order.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces as gs

__all__ = ["flat_size", "flatten_batch", "leaf_spaces", "remove_keys"]


@functools.singledispatch
def flat_size(space: gs.Space) -> int:
    raise ValueError(f"FlattenObservations: {type(space).__name__} observations are not supported")


@flat_size.register
def _(space: gs.Box) -> int:
    return int(np.prod(space.shape, dtype=np.int64))


@flat_size.register
def _(space: gs.MultiBinary) -> int:
    return int(np.prod(space.shape, dtype=np.int64))


@flat_size.register
def _(space: gs.Discrete) -> int:
    return int(space.n)


@flat_size.register
def _(space: gs.MultiDiscrete) -> int:
    return int(np.sum(space.nvec))


@flat_size.register
def _(space: gs.Tuple) -> int:
    return sum(flat_size(s) for s in space.spaces)


@flat_size.register
def _(space: gs.Dict) -> int:
    return sum(flat_size(s) for s in space.spaces.values())


def leaf_spaces(space: gs.Space) -> list[tuple[str, gs.Space]]:
    """``(path, leaf space)`` in the order the flat vector holds them (Dict keys sorted)."""
    if isinstance(space, gs.Dict):
        return [(f"{k}{'.' + p if p else ''}", leaf) for k in sorted(space.spaces)
                for p, leaf in leaf_spaces(space.spaces[k])]
    if isinstance(space, gs.Tuple):
        return [(f"{i}{'.' + p if p else ''}", leaf) for i, s in enumerate(space.spaces) for p, leaf in leaf_spaces(s)]
    return [("", space)]


def remove_keys(space: gs.Space, keys: Sequence[str]) -> gs.Space:
    """The Dict space without ``keys`` (FlattenObservations' ``keys_to_remove``)."""
    if not keys:
        return space
    if not isinstance(space, gs.Dict):
        raise ValueError(f"FlattenObservations: keys_to_remove {list(keys)} needs a Dict observation space")
    return gs.Dict({k: s for k, s in space.spaces.items() if k not in keys})


def _leaf_values(space: gs.Space, value: Any) -> list[Any]:
    if isinstance(space, gs.Dict):
        return [v for k in sorted(space.spaces) for v in _leaf_values(space.spaces[k], value[k])]
    if isinstance(space, gs.Tuple):
        return [v for s, x in zip(space.spaces, value, strict=True) for v in _leaf_values(s, x)]
    return [value]


def _one_hot(index: np.ndarray, depth: int) -> np.ndarray:
    out = np.zeros((index.shape[0], depth), np.float32)
    out[np.arange(index.shape[0]), index] = 1.0
    return out


def _leaf_block(space: gs.Space, column: list[Any]) -> np.ndarray:
    """(B, width) float32 for one leaf over the batch."""
    rows = len(column)
    if isinstance(space, gs.Discrete):
        return _one_hot(np.asarray(column, np.int64).reshape(rows), int(space.n))
    if isinstance(space, gs.MultiDiscrete):
        values = np.asarray(column, np.int64).reshape(rows, -1)
        return np.concatenate([_one_hot(values[:, i], int(n)) for i, n in enumerate(np.ravel(space.nvec))], axis=1)
    return np.asarray(column).reshape(rows, -1).astype(np.float32)


def flatten_batch(space: gs.Space, observations: Sequence[Any] | np.ndarray) -> np.ndarray:
    """``(B, flat_size(space))`` float32 rows of a batch of observations of ``space``."""
    if isinstance(space, gs.Box | gs.MultiBinary):
        return np.asarray(observations).reshape(len(observations), -1).astype(np.float32)
    leaves = [leaf for _, leaf in leaf_spaces(space)]
    columns: list[list[Any]] = [[] for _ in leaves]
    for obs in observations:
        for column, value in zip(columns, _leaf_values(space, obs), strict=True):
            column.append(value)
    return np.concatenate([_leaf_block(leaf, column) for leaf, column in zip(leaves, columns, strict=True)], axis=1)
