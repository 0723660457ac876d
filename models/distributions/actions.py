"""Batched actions: flat rows, RLlib's clip/unsquash, and JSON conversion (torch-free).

An action batch is a numpy structure in the action space's shape: one array per leaf with
a leading batch axis ``B`` (a tuple for Tuple, a dict for Dict). Inside the service
actions are in *model space*, exactly what RLlib's distributions return:

* Discrete / MultiDiscrete: category **indices** 0..n-1 (``start`` is not added);
* integer Box: indices 0..max(high)-min(low) (``low`` is not added);
* float Box: raw values (for SquashedGaussian/normalised policies, [-1, 1]).

The flat row (``flatten_actions``) is RLlib's ``flatten_to_single_ndarray`` layout, the
layout of ``prev_actions`` model inputs: leaves in flattened order (Tuple order, Dict keys
sorted), Discrete = 1 column holding the index, MultiDiscrete = k columns, Box and the
rest = prod(shape) columns, C order.

JSON values (``actions_to_json``/``actions_from_json``) are in *env space*: members of the
action space, so a client can hand them to its gymnasium env. Discrete and MultiDiscrete
add ``start``, an integer Box adds ``min(low)``; ``actions_from_json`` subtracts them again
and rejects values outside the space. Non-finite floats are the strings "inf", "-inf",
"nan" (the space-JSON convention), since JSON has no such numbers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, TypeGuard

import numpy as np
from gymnasium import spaces as gs

from ..spaces import Simplex, float_to_json, shape_of
from .structure import Path, flatten_leaves, leaf_paths, leaf_spaces, path_str, unflatten_leaves

__all__ = [
    "action_width",
    "actions_from_json",
    "actions_to_json",
    "batch_size_of",
    "clip_actions",
    "flatten_actions",
    "is_int_box",
    "prev_action_from_json",
    "unflatten_actions",
    "unsquash_actions",
]


def is_int_box(space: gs.Space) -> TypeGuard[gs.Box]:
    """RLlib's test for an integer Box: the dtype *name* starts with "int" (uint8 does not)."""
    return isinstance(space, gs.Box) and np.dtype(space.dtype).name.startswith("int")


# --------------------------------------------------------------------------- widths

@functools.singledispatch
def _leaf_width(space: gs.Space) -> int:
    raise ValueError(f"no flat action layout for {type(space).__name__} action leaf {space!r}")


@_leaf_width.register
def _(space: gs.Discrete) -> int:
    return 1


@_leaf_width.register
def _(space: gs.MultiDiscrete) -> int:
    return int(space.nvec.size)


@_leaf_width.register(gs.Box)
@_leaf_width.register(gs.MultiBinary)
@_leaf_width.register(Simplex)
def _(space: gs.Space) -> int:
    return int(np.prod(shape_of(space), dtype=np.int64))


def action_width(action_space: gs.Space) -> int:
    """Columns of one flattened action (``A`` of ``flatten_actions``)."""
    return sum(_leaf_width(s) for s in leaf_spaces(action_space))


# --------------------------------------------------------------------------- flat rows

def batch_size_of(action_space: gs.Space, actions: Any) -> int:
    """The common leading axis of every leaf, or a ValueError naming the leaf that differs."""
    sizes = {}
    for path, leaf in zip(leaf_paths(action_space), flatten_leaves(action_space, actions), strict=True):
        arr = np.asarray(leaf)
        if arr.ndim == 0:
            raise ValueError(f"action leaf '{path_str(path)}' needs a leading batch axis, got a scalar")
        sizes[path_str(path)] = arr.shape[0]
    if len(set(sizes.values())) > 1:
        raise ValueError(f"action leaves disagree on the batch size: {sizes}")
    return next(iter(sizes.values()))


def flatten_actions(action_space: gs.Space, actions: Any) -> np.ndarray:
    """Structured batch -> ``(B, A)`` float32 rows (RLlib's flattened action layout)."""
    batch = batch_size_of(action_space, actions)
    cols = []
    for path, space, leaf in zip(
        leaf_paths(action_space), leaf_spaces(action_space), flatten_leaves(action_space, actions), strict=True
    ):
        arr = np.asarray(leaf).reshape(batch, -1)
        if arr.shape[1] != _leaf_width(space):
            raise ValueError(
                f"action leaf '{path_str(path)}': expected {_leaf_width(space)} values per row for {space}, "
                f"got {arr.shape[1]}"
            )
        cols.append(arr.astype(np.float32))
    return np.concatenate(cols, axis=1) if cols else np.zeros((batch, 0), np.float32)


@functools.singledispatch
def _leaf_from_flat(space: gs.Space, cols: np.ndarray) -> np.ndarray:
    return cols.reshape((cols.shape[0], *shape_of(space))).astype(space.dtype)


@_leaf_from_flat.register
def _(space: gs.Discrete, cols: np.ndarray) -> np.ndarray:
    return np.rint(cols[:, 0]).astype(np.int64)


@_leaf_from_flat.register
def _(space: gs.MultiDiscrete, cols: np.ndarray) -> np.ndarray:
    return np.rint(cols).reshape((cols.shape[0], *shape_of(space))).astype(np.int64)


@_leaf_from_flat.register
def _(space: gs.Box, cols: np.ndarray) -> np.ndarray:
    if np.dtype(space.dtype).kind in "iu":
        cols = np.rint(cols)
    return cols.reshape((cols.shape[0], *shape_of(space))).astype(space.dtype)


def unflatten_actions(action_space: gs.Space, flat: np.ndarray) -> Any:
    """``(B, A)`` rows -> the structured batch (integer leaves rounded to int64/space dtype)."""
    flat = np.asarray(flat)
    width = action_width(action_space)
    if flat.ndim != 2 or flat.shape[1] != width:
        raise ValueError(f"flat actions must have shape (B, {width}), got {flat.shape}")
    spaces = leaf_spaces(action_space)
    bounds = np.cumsum([_leaf_width(s) for s in spaces])[:-1]
    parts = np.split(flat, bounds, axis=1)
    return unflatten_leaves(action_space, [_leaf_from_flat(s, p) for s, p in zip(spaces, parts, strict=True)])


# --------------------------------------------------------------------------- clip / unsquash

def _map_leaves(action_space: gs.Space, actions: Any, fn: Callable[[gs.Space, np.ndarray], np.ndarray]) -> Any:
    leaves = flatten_leaves(action_space, actions)
    mapped = [fn(s, np.asarray(a)) for s, a in zip(leaf_spaces(action_space), leaves, strict=True)]
    return unflatten_leaves(action_space, mapped)


def clip_actions(action_space: gs.Space, actions: Any) -> Any:
    """RLlib's ``clip_action``: clip every float Box leaf to [low, high].

    Integer Box leaves are category indices in model space (0..high-low), so the
    value bounds do not apply to them and they are returned unchanged (RLlib would
    clip the indices against the value bounds, which corrupts them when low != 0).
    """

    def clip(space: gs.Space, a: np.ndarray) -> np.ndarray:
        if isinstance(space, gs.Box) and not is_int_box(space):
            return np.clip(a, space.low, space.high).astype(a.dtype, copy=False)
        return a

    return _map_leaves(action_space, actions, clip)


def unsquash_actions(action_space: gs.Space, actions: Any) -> Any:
    """RLlib's ``unsquash_action`` (``normalize_actions=True``): [-1, 1] -> [low, high].

    Applies to Box leaves of dtype float32/float64 whose bounds are all finite:
    ``low + (a + 1) * (high - low) / 2``, then clipped to [low, high]. Other leaves pass
    through unchanged.
    """

    def unsquash(space: gs.Space, a: np.ndarray) -> np.ndarray:
        if (
            isinstance(space, gs.Box)
            and np.dtype(space.dtype) in (np.float32, np.float64)
            and np.all(space.bounded_below)
            and np.all(space.bounded_above)
        ):
            out = space.low + (a + 1.0) * (space.high - space.low) / 2.0
            return np.clip(out, space.low, space.high).astype(a.dtype if a.dtype.kind == "f" else space.dtype)
        return a

    return _map_leaves(action_space, actions, unsquash)


# --------------------------------------------------------------------------- JSON

def _offset(space: gs.Space) -> np.ndarray | int:
    """What env values add to model-space indices: ``start``, or ``min(low)`` for int Box."""
    if isinstance(space, gs.Discrete | gs.MultiDiscrete):
        return np.asarray(space.start, dtype=np.int64)
    if is_int_box(space):
        return int(np.min(space.low))
    return 0


def _leaf_to_json(space: gs.Space, value: np.ndarray) -> Any:
    if isinstance(space, gs.Discrete | gs.MultiDiscrete) or is_int_box(space):
        return (np.asarray(value, dtype=np.int64) + _offset(space)).tolist()
    if isinstance(space, gs.MultiBinary) or np.dtype(getattr(space, "dtype", np.float32)).kind in "iub":
        return np.asarray(value).astype(np.int64).tolist()
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim == 0:
        return float_to_json(float(arr))
    return np.vectorize(float_to_json, otypes=[object])(arr).tolist()


def actions_to_json(action_space: gs.Space, actions: Any, row: int) -> Any:
    """Row ``row`` of a model-space action batch as JSON-able env-space values.

    Discrete -> int (index + start); MultiDiscrete / integer Box -> nested lists of ints
    (+ start / + min(low)); float Box / Simplex -> nested lists of floats (a 0-d Box a
    float); Tuple -> list; Dict -> object in the space's key order.
    """
    leaves = [np.asarray(leaf)[row] for leaf in flatten_leaves(action_space, actions)]
    values = [_leaf_to_json(s, v) for s, v in zip(leaf_spaces(action_space), leaves, strict=True)]
    return _as_json_structure(unflatten_leaves(action_space, values))


def _as_json_structure(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_as_json_structure(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_json_structure(v) for k, v in value.items()}
    return value


def _parse_number(value: Any, where: str) -> float:
    if isinstance(value, str):
        lowered = value.strip().lower()
        table = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "nan": math.nan}
        if lowered in table:
            return table[lowered]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"action at '{where}': expected a number, got {value!r}")
    return float(value)


def _float_array(value: Any, where: str) -> np.ndarray:
    if isinstance(value, list):
        items = [_float_array(v, where) for v in value]
        try:
            return np.asarray(items, dtype=np.float64)
        except ValueError as exc:
            raise ValueError(f"action at '{where}': ragged nested list {value!r}") from exc
    return np.asarray(_parse_number(value, where), dtype=np.float64)


def _leaf_from_json(space: gs.Space, value: Any, where: str, bounds: bool = True) -> np.ndarray:
    shape = tuple(getattr(space, "shape", ()) or ())
    raw = _float_array(value, where)
    if raw.shape != shape:
        raise ValueError(f"action at '{where}': expected shape {list(shape)} for {space}, got shape {list(raw.shape)}")
    if isinstance(space, gs.Discrete | gs.MultiDiscrete) or is_int_box(space):
        if not np.all(raw == np.round(raw)):
            raise ValueError(f"action at '{where}': expected integers for {space}, got {value!r}")
        env = raw.astype(np.int64)
        if not space.contains(env.astype(space.dtype)):
            raise ValueError(f"action at '{where}': {value!r} is not in {space}")
        return (env - _offset(space)).astype(np.int64)
    arr = raw.astype(space.dtype)
    if not bounds and isinstance(space, gs.Box) and np.dtype(space.dtype).kind == "f":
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"action at '{where}': expected finite numbers for {space}, got {value!r}")
        return arr
    if not space.contains(arr):
        raise ValueError(f"action at '{where}': {value!r} is not in {space}")
    return arr


def _json_leaves(space: gs.Space, value: Any) -> list[Any]:
    """Like flatten_leaves, but a JSON list stands for a Tuple."""
    return flatten_leaves(space, _tuplify(space, value, ()))


def _tuplify(space: gs.Space, value: Any, path: Path) -> Any:
    if isinstance(space, gs.Tuple):
        if not isinstance(value, list | tuple) or len(value) != len(space.spaces):
            raise ValueError(
                f"action at '{path_str(path)}': expected a list of {len(space.spaces)} items, got {value!r}"
            )
        return tuple(_tuplify(s, v, (*path, i)) for i, (s, v) in enumerate(zip(space.spaces, value, strict=True)))
    if isinstance(space, gs.Dict):
        if not isinstance(value, dict) or set(value) != set(space.spaces):
            got = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise ValueError(f"action at '{path_str(path)}': expected keys {list(space.spaces)}, got {got}")
        return {k: _tuplify(space.spaces[k], value[k], (*path, k)) for k in space.spaces}
    return value


def actions_from_json(action_space: gs.Space, value: Any) -> Any:
    """One env-space JSON action -> a model-space batch of one (leading axis 1).

    Inverse of :func:`actions_to_json`; raises ValueError naming the path, the space and
    the received value when the action is malformed or outside the space.
    """
    leaves = _json_leaves(action_space, value)
    parsed = [
        _leaf_from_json(s, v, path_str(p) or "$")[None]
        for s, v, p in zip(leaf_spaces(action_space), leaves, leaf_paths(action_space), strict=True)
    ]
    return unflatten_leaves(action_space, parsed)


def prev_action_from_json(action_space: gs.Space, value: Any) -> Any:
    """A reported *previous* action -> a model-space batch of one, as the model's
    ``prev_actions`` input sees it.

    Like :func:`actions_from_json`, except that float Box leaves are checked for shape,
    dtype and finiteness but not for the bounds: RLlib feeds recurrent models the raw
    sampled action (before unsquashing or clipping), which is routinely outside the Box
    (e.g. 2.84 for Box(-2, 2)). Discrete, MultiDiscrete, integer Box and MultiBinary
    leaves must still be members of their space (the model one-hot encodes them).
    """
    leaves = _json_leaves(action_space, value)
    parsed = [
        _leaf_from_json(s, v, path_str(p) or "$", bounds=False)[None]
        for s, v, p in zip(leaf_spaces(action_space), leaves, leaf_paths(action_space), strict=True)
    ]
    return unflatten_leaves(action_space, parsed)
