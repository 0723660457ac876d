"""Columns: a batch as one array per leaf of a space, batch axis first (the tensor form).

The JSON API carries a batch as one value per row; tensor protocols (the Open Inference
Protocol, ``rlserve.service.protocols``) carry one array per leaf. This module is the codec
for that form, one function per space type like ``rlserve.service.step.codec``:

- ``decode_column(space, arr, field)`` validates a leaf's ``(B, *shape)`` column as the
  codec validates one JSON value of that leaf (casts that lose nothing, finite floats,
  Discrete/MultiDiscrete ranges, MultiBinary 0/1), vectorised over the rows; errors name
  the field and the first offending row.
- ``observations_from_columns`` turns validated leaves into what ``Preparer`` takes as
  decoded observations (``Rows.decoded``); ``values_from_columns`` into one JSON-like value
  per row (for reported actions, which take the JSON path's checks).
- ``action_columns`` is ``codec.encode_batch`` as arrays: env-space actions per leaf.

Leaves are in the flattened order of ``rlserve.models.distributions.structure`` (Tuple
order, Dict keys sorted).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
from gymnasium import spaces as gs

from rlserve.models.distributions.structure import flatten_leaves, leaf_spaces
from rlserve.models.spaces import Simplex
from rlserve.service.errors import InvalidInput
from rlserve.service.step import codec
from rlserve.service.step.codec import describe_space

__all__ = ["decode_column", "observations_from_columns", "values_from_columns", "action_columns",
           "is_structured"]


def _fail(field: str, message: str, space: gs.Space, received: Any) -> InvalidInput:
    return InvalidInput(f"{field}: {message}", field=field, expected=describe_space(space), received=received)


def _first(bad: np.ndarray) -> tuple[int, list[int]]:
    """(row, index within the row) of the first True in ``bad`` (B, ...)."""
    where = [int(i) for i in np.argwhere(bad)[0]]
    return where[0], where[1:]


def _at(row: int, index: list[int]) -> str:
    return f"row {row}" + (f" index {index}" if index else "")


def _received(arr: np.ndarray) -> str:
    return f"an array of shape {list(arr.shape)} and dtype {arr.dtype.name}"


@functools.singledispatch
def decode_column(space: gs.Space, arr: np.ndarray, field: str) -> np.ndarray:
    """Validate ``arr`` (B, *space.shape) as B values of the leaf ``space``; returns it
    in the space's dtype (the same array when it already is). Raises ``InvalidInput``."""
    raise _fail(field, f"{type(space).__name__} leaves have no tensor form", space, _received(arr))


def _check_shape(space: gs.Space, arr: np.ndarray, field: str, shape: tuple[int, ...]) -> None:
    if arr.ndim == 0 or arr.shape[1:] != shape:
        raise _fail(field, f"expected a column of shape [B{''.join(f', {d}' for d in shape)}]", space,
                    _received(arr))
    if arr.dtype.kind not in "biuf":
        raise _fail(field, f"expected numbers, got dtype {arr.dtype.name}", space, _received(arr))


def _cast(space: gs.Space, arr: np.ndarray, field: str) -> np.ndarray:
    """``arr`` in the space's dtype, refusing values that dtype cannot hold (as the codec),
    naming the first value at fault."""
    target = np.dtype(space.dtype)
    if arr.dtype == target:
        return arr
    problem = codec.cast_problem(arr, target)
    if problem is not None:
        message, bad = problem
        row, index = _first(bad)
        raise _fail(field, f"{message}; {_at(row, index)} is {arr[(row, *index)].item()!r}", space, _received(arr))
    return codec.cast_unchecked(arr, target)


def _finite(space: gs.Space, arr: np.ndarray, field: str) -> np.ndarray:
    # A finite sum means finite values (NaN and inf propagate); a sum that merely
    # overflows falls through to the exact check.
    if arr.dtype.kind != "f" or math.isfinite(np.add.reduce(arr, axis=None)):
        return arr
    bad = ~np.isfinite(arr)
    if bad.any():
        row, index = _first(bad)
        raise _fail(field, f"values must be finite; {_at(row, index)} is {arr[(row, *index)].item()!r} "
                    f"as {arr.dtype.name}", space, _received(arr))
    return arr


@decode_column.register(gs.Box)
@decode_column.register(Simplex)
def _(space: gs.Space, arr: np.ndarray, field: str) -> np.ndarray:
    _check_shape(space, arr, field, space.shape)  # type: ignore[arg-type]  # Box and Simplex have shapes
    return _finite(space, _cast(space, arr, field), field)


@decode_column.register
def _(space: gs.Discrete, arr: np.ndarray, field: str) -> np.ndarray:
    _check_shape(space, arr, field, ())
    if arr.dtype.kind == "b":  # the codec refuses JSON booleans for a Discrete too
        raise _fail(field, "expected integers, got booleans", space, _received(arr))
    out = _cast(space, arr, field)
    low, high = int(space.start), int(space.start + space.n - 1)
    bad = (out < low) | (out > high)
    if bad.any():
        row, _ = _first(bad)
        raise _fail(field, f"row {row}: value {int(out[row])} is outside [{low}, {high}]", space, _received(arr))
    return out


@decode_column.register
def _(space: gs.MultiDiscrete, arr: np.ndarray, field: str) -> np.ndarray:
    _check_shape(space, arr, field, space.shape)
    out = _cast(space, arr, field)
    low, high = space.start, space.start + space.nvec
    bad = (out < low) | (out >= high)
    if bad.any():
        row, index = _first(bad)
        at = tuple(index)
        raise _fail(field, f"{_at(row, index)}: value {out[(row, *index)].item()} is outside "
                    f"[{low[at]}, {high[at] - 1}]", space, _received(arr))
    return out


@decode_column.register
def _(space: gs.MultiBinary, arr: np.ndarray, field: str) -> np.ndarray:
    _check_shape(space, arr, field, space.shape)
    out = _cast(space, arr, field)
    bad = (out != 0) & (out != 1)
    if bad.any():
        row, index = _first(bad)
        raise _fail(field, f"MultiBinary values must be 0 or 1; {_at(row, index)} is {out[(row, *index)].item()}",
                    space, _received(arr))
    return out


# --------------------------------------------------------------------------- rows

def is_structured(space: gs.Space) -> bool:
    return isinstance(space, gs.Tuple | gs.Dict)


def _assemble(space: gs.Space, leaves: Iterator[Any]) -> Any:
    """One value of ``space`` from its leaves in flattened order (tuples for Tuple, dicts
    in the space's key order for Dict, as the codec decodes them)."""
    if isinstance(space, gs.Tuple):
        return tuple(_assemble(child, leaves) for child in space.spaces)
    if isinstance(space, gs.Dict):
        built = {key: _assemble(space.spaces[key], leaves) for key in sorted(space.spaces)}
        return {key: built[key] for key in space.spaces}
    return next(leaves)


def observations_from_columns(space: gs.Space, columns: list[np.ndarray]) -> list[Any] | np.ndarray:
    """Validated leaf columns -> ``Rows.decoded`` observations: the column itself for a
    simple space, else one structured value per row (Discrete leaves as ints, the others
    as row views of their column)."""
    if not is_structured(space):
        return columns[0]
    leaves = [col.tolist() if isinstance(s, gs.Discrete) else col for s, col in zip(leaf_spaces(space), columns,
                                                                                      strict=True)]
    return [_assemble(space, iter([leaf[i] for leaf in leaves])) for i in range(len(columns[0]))]


def values_from_columns(space: gs.Space, columns: list[np.ndarray]) -> list[Any]:
    """Leaf columns -> one JSON-like value per row (lists, numbers; tuples for Tuple)."""
    leaves = [col.tolist() for col in columns]
    if not is_structured(space):
        return leaves[0]
    return [_assemble(space, iter([leaf[i] for leaf in leaves])) for i in range(len(leaves[0]))]


# --------------------------------------------------------------------------- actions

@functools.singledispatch
def _env_leaf(space: gs.Space, batched: Any) -> np.ndarray:
    return np.asarray(batched)


@_env_leaf.register
def _(space: gs.Discrete, batched: Any) -> np.ndarray:
    return np.asarray(batched, dtype=np.int64) + int(space.start)


@_env_leaf.register
def _(space: gs.MultiDiscrete, batched: Any) -> np.ndarray:
    return np.asarray(batched, dtype=np.int64) + space.start.astype(np.int64)


@_env_leaf.register
def _(space: gs.Box, batched: Any) -> np.ndarray:
    if np.dtype(space.dtype).name.startswith("int"):  # RLlib's integer-Box test (uint8 is not)
        return np.asarray(batched, dtype=np.int64) + int(np.min(space.low))
    if np.dtype(space.dtype).kind in "iub":
        return np.asarray(batched).astype(np.int64)
    return np.asarray(batched)


@_env_leaf.register
def _(space: gs.MultiBinary, batched: Any) -> np.ndarray:
    return np.asarray(batched).astype(np.int64)


def action_columns(space: gs.Space, batched: Any) -> list[np.ndarray]:
    """Model-space actions (B rows) -> env-space arrays, one per leaf in flattened order:
    the values ``codec.encode_batch`` writes as JSON, as arrays."""
    if not is_structured(space):
        return [_env_leaf(space, batched)]
    return [_env_leaf(s, leaf) for s, leaf in zip(leaf_spaces(space), flatten_leaves(space, batched), strict=True)]
