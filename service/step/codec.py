"""JSON values <-> space values, validated, one function per space type.

``decode_value(space, data, field)`` turns the JSON form of an observation (or of an
action a client reports) into the value gymnasium would produce: numpy arrays for Box,
MultiBinary and MultiDiscrete, ``int`` for Discrete, tuples, dicts in space key order and
lists for Repeated. Anything that does not fit raises ``InvalidInput`` naming the field,
the expected space and what was received, before any session state is touched.

Images (any Box) may also come as raw bytes: ``{"b64": "...", "dtype": "uint8",
"shape": [84, 84, 3]}`` (C order), which decodes ~20x faster than nested lists.

``encode_batch`` turns a batched structure (what a distribution samples) into one JSON
value per row, and ``floats_json`` writes float outputs (logp, value, ...) with JSON's
nulls for non-finite entries. ``is_plain_row`` is the fast path for the commonest
observation: a flat float32 Box row, checked in Python and converted once per batch.
"""

from __future__ import annotations

import base64
import binascii
import functools
import math
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces as gs

from rlserve.models.spaces import Repeated, Simplex, float_to_json, space_to_json
from rlserve.service.errors import InvalidInput, quoted, summarize_received
from rlserve.service.step.received import not_numbers

__all__ = ["decode_value", "decode_batch", "encode_batch", "floats_json", "describe_space", "is_plain_row"]

# A client's 1e39 overflowing float32 is rejected as non-finite right after the cast;
# numpy's warning about it would only be log noise (errstate is too slow for the hot path).
warnings.filterwarnings("ignore", "overflow encountered in cast", RuntimeWarning, module=__name__)


def describe_space(space: gs.Space) -> Any:
    """The space's JSON schema: what an error's ``expected`` shows."""
    return space_to_json(space)


def _fail(field: str, message: str, space: gs.Space | Any, received: Any) -> InvalidInput:
    expected = describe_space(space) if isinstance(space, gs.Space) else space
    return InvalidInput(f"{field}: {message}", field=field, expected=expected, received=summarize_received(received))


@functools.singledispatch
def decode_value(space: gs.Space, data: Any, field: str) -> Any:
    """Decode and validate one JSON value of ``space``; ``field`` names it in errors."""
    raise _fail(field, f"space type {type(space).__name__} is not supported", space, data)


# --------------------------------------------------------------------------- arrays

_MAX_DTYPE_NAME = 16  # "complex128", "<f8", "float64": every numeric name fits

def _from_b64(space: gs.Box, data: Mapping[str, Any], field: str) -> np.ndarray:
    extra = set(data) - {"b64", "dtype", "shape"}
    if extra:
        raise _fail(field, f"unknown keys {sorted(extra)} in a base64 array", space, data)
    dtype_name = data.get("dtype", np.dtype(space.dtype).name)
    # Not a string: np.dtype(None) would silently mean float64. No numeric dtype's name is
    # long; a long one is a claim ("(99999999999,)f8") numpy would try to build.
    if not isinstance(dtype_name, str) or len(dtype_name) > _MAX_DTYPE_NAME:
        raise _fail(f"{field}.dtype", "expected a numeric dtype name such as 'uint8' or 'float32'",
                    np.dtype(space.dtype).name, dtype_name)
    try:
        dtype = np.dtype(dtype_name)
    except (TypeError, ValueError, OverflowError):
        raise _fail(f"{field}.dtype", f"unknown dtype {quoted(dtype_name)}", np.dtype(space.dtype).name,
                    dtype_name) from None
    if dtype.kind not in "biuf":
        raise _fail(f"{field}.dtype", f"dtype {dtype.name} is not numeric", np.dtype(space.dtype).name, dtype_name)
    shape = data.get("shape", list(space.shape))
    if not isinstance(shape, list) or shape != list(space.shape):
        raise _fail(f"{field}.shape", f"shape {quoted(shape)} does not match {list(space.shape)}", list(space.shape),
                    shape)
    raw = data.get("b64")
    if not isinstance(raw, str):
        raise _fail(f"{field}.b64", "expected a base64 string", space, raw)
    try:
        buffer = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise _fail(f"{field}.b64", "invalid base64", space, raw) from None
    expected_bytes = int(np.prod(space.shape, dtype=np.int64)) * dtype.itemsize
    if len(buffer) != expected_bytes:
        raise _fail(f"{field}.b64", f"decoded {len(buffer)} bytes, expected {expected_bytes}", space, len(buffer))
    arr = np.frombuffer(buffer, dtype=dtype).reshape(space.shape)
    return _cast(space, arr, field, data)


def cast_problem(arr: np.ndarray, target: np.dtype) -> tuple[str, np.ndarray] | None:
    """Why ``arr`` cannot be cast to ``target`` without changing a value (a message and the
    mask of the values at fault), or None. Shared by every decoder of numbers (here and the
    column decoder of ``rlserve.service.step.columns``), which word the refusal themselves."""
    if target.kind in "iu":
        if arr.dtype.kind == "f":
            bad = ~np.isfinite(arr) | (arr != np.round(arr))
            if bad.any():
                return f"expected integers for dtype {target.name}", bad
        if arr.size:
            info = np.iinfo(target)
            bad = (arr < info.min) | (arr > info.max)
            if bad.any():
                return f"values outside the range of {target.name}", bad
    elif target.kind == "b" and arr.size and arr.dtype.kind != "b":
        bad = (arr != 0) & (arr != 1)
        if bad.any():
            return "expected booleans", bad
    return None


def cast_unchecked(arr: np.ndarray, target: np.dtype) -> np.ndarray:
    with np.errstate(over="ignore"):  # a float overflow becomes inf, which the callers refuse
        return arr.astype(target)


def _cast(space: gs.Space, arr: np.ndarray, field: str, data: Any) -> np.ndarray:
    """Cast to the space dtype, refusing values that the dtype cannot hold."""
    target = np.dtype(space.dtype)
    if arr.dtype == target:
        return arr
    problem = cast_problem(arr, target)
    if problem is not None:
        raise _fail(field, problem[0], space, data)
    return cast_unchecked(arr, target)


def _array(space: gs.Space, data: Any, field: str, shape: tuple[int, ...]) -> np.ndarray:
    if isinstance(data, Mapping) and isinstance(space, gs.Box):
        return _from_b64(space, data, field)
    if isinstance(data, str | bytes | Mapping) or data is None:
        raise _fail(field, f"expected a number array of shape {list(shape)}", space, data)
    try:
        arr = np.asarray(data)
    except (ValueError, TypeError):
        raise _fail(field, not_numbers(data, list(shape)), space, data) from None
    if arr.dtype.kind not in "biuf":  # strings, nulls, objects: said as JSON, not as numpy's dtype
        raise _fail(field, not_numbers(data, list(shape)), space, data)
    if arr.shape != shape:
        raise _fail(field, f"expected shape {list(shape)}, got {list(arr.shape)}", space, data)
    return _cast(space, arr, field, data)


@decode_value.register
def _(space: gs.Box, data: Any, field: str) -> np.ndarray:
    if type(data) is list and space.dtype.kind == "f":
        # The common case (a float Box as nested lists of numbers) in three numpy calls;
        # anything unusual falls through to the checks below, which name the problem.
        try:
            arr = np.asarray(data)
        except (ValueError, TypeError):
            arr = None
        if arr is not None and arr.dtype.kind in "fiu" and arr.shape == space.shape:
            arr = arr.astype(space.dtype, copy=False)
            # A finite sum means finite values (NaN and inf propagate); a sum that merely
            # overflows falls through to the exact check below.
            if math.isfinite(np.add.reduce(arr, axis=None)):
                return arr
    arr = _array(space, data, field, space.shape)
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise _fail(field, _non_finite(arr, data), space, data)
    return arr


def _non_finite(arr: np.ndarray, data: Any) -> str:
    """Where ``arr`` (``data`` decoded, in the space's dtype) first holds NaN or an infinity."""
    index = [int(i) for i in np.argwhere(~np.isfinite(arr))[0]]
    where = f"element {index[0]}" if len(index) == 1 else f"element {index}" if index else "the value"
    sent = data
    for i in index:  # the number as sent, when it came as JSON lists
        sent = sent[i] if isinstance(sent, list) and i < len(sent) else None
    if isinstance(sent, int | float) and math.isfinite(sent):
        return f"expected finite numbers; {where} is {sent!r}, beyond the range of {arr.dtype.name}"
    return f"expected finite numbers; {where} is {arr[tuple(index)].item()!r}"


@decode_value.register
def _(space: Simplex, data: Any, field: str) -> np.ndarray:
    arr = _array(space, data, field, space.shape)
    if not np.isfinite(arr).all():
        raise _fail(field, _non_finite(arr, data), space, data)
    return arr


@decode_value.register
def _(space: gs.MultiBinary, data: Any, field: str) -> np.ndarray:
    arr = _array(space, data, field, space.shape)
    if arr.size and not np.all((arr == 0) | (arr == 1)):
        raise _fail(field, "MultiBinary values must be 0 or 1", space, data)
    return arr


@decode_value.register
def _(space: gs.MultiDiscrete, data: Any, field: str) -> np.ndarray:
    arr = _array(space, data, field, space.shape)
    low, high = space.start, space.start + space.nvec
    bad = (arr < low) | (arr >= high)
    if np.any(bad):
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        raise _fail(
            field,
            f"value {arr[index].item()} at index {list(index)} is outside "
            f"[{low[index]}, {high[index] - 1}]",
            space,
            data,
        )
    return arr


# --------------------------------------------------------------------------- scalars

@decode_value.register
def _(space: gs.Discrete, data: Any, field: str) -> int:
    if isinstance(data, float) and data.is_integer():
        data = int(data)
    if isinstance(data, bool) or not isinstance(data, int):
        raise _fail(field, "expected an integer", space, data)
    low, high = int(space.start), int(space.start + space.n - 1)
    if not low <= data <= high:
        raise _fail(field, f"value {data} is outside [{low}, {high}]", space, data)
    return data


# --------------------------------------------------------------------------- containers

@decode_value.register
def _(space: gs.Tuple, data: Any, field: str) -> tuple:
    if not isinstance(data, list | tuple) or len(data) != len(space.spaces):
        raise _fail(field, f"expected a list of {len(space.spaces)} items", space, data)
    return tuple(
        decode_value(sub, item, f"{field}[{i}]") for i, (sub, item) in enumerate(zip(space.spaces, data, strict=True))
    )


@decode_value.register
def _(space: gs.Dict, data: Any, field: str) -> dict:
    if not isinstance(data, Mapping):
        raise _fail(field, f"expected an object with keys {list(space.spaces)}", space, data)
    missing = [k for k in space.spaces if k not in data]
    extra = [k for k in data if k not in space.spaces]
    if missing or extra:
        parts = ([f"missing keys {missing}"] if missing else []) + ([f"unknown keys {extra}"] if extra else [])
        raise _fail(field, "; ".join(parts), list(space.spaces), sorted(data))
    return {k: decode_value(sub, data[k], f"{field}.{k}") for k, sub in space.spaces.items()}


@decode_value.register
def _(space: Repeated, data: Any, field: str) -> list:
    if not isinstance(data, list | tuple):
        raise _fail(field, f"expected a list of at most {space.max_len} items", space, data)
    if len(data) > space.max_len:
        raise _fail(field, f"{len(data)} items exceed max_len {space.max_len}", space, data)
    return [decode_value(space.child_space, item, f"{field}[{i}]") for i, item in enumerate(data)]


# --------------------------------------------------------------------------- batches

def decode_batch(space: gs.Space, items: list[Any] | np.ndarray, field: str) -> list[Any] | np.ndarray:
    """Decode a list of values, naming each one ``field[i]`` in errors.

    A Box batch sent as plain lists comes back stacked as one (B, *shape) array.
    """
    if isinstance(space, gs.Box) and items and not isinstance(items[0], Mapping):
        stacked = _decode_box_rows(space, items, field)
        if stacked is not None:
            return stacked
    return [decode_value(space, item, f"{field}[{i}]") for i, item in enumerate(items)]


def _decode_box_rows(space: gs.Box, items: list[Any] | np.ndarray, field: str) -> np.ndarray | None:
    """One numpy call for a batch of list-form Box values; None defers to per-row errors."""
    try:
        arr = np.asarray(items)
    except (ValueError, TypeError):
        return None
    if arr.dtype.kind not in "biuf" or arr.shape != (len(items), *space.shape):
        return None
    try:
        out = _cast(space, arr, field, None)
    except InvalidInput:
        return None
    # Checked after the cast: a finite double such as 1e39 is inf as float32. NaN and
    # inf survive the cast, so this one check covers them too.
    if out.dtype.kind == "f" and not np.isfinite(out).all():
        return None  # the per-row decode names the row
    return out


@functools.singledispatch
def encode_batch(space: gs.Space, batched: Any) -> list[Any]:
    """One env-space JSON value per row of a model-space batch of ``space``.

    Model space is what distributions return: Discrete/MultiDiscrete indices from 0 and
    integer-Box indices from 0; env space adds ``start`` / ``min(low)`` back (the same
    convention as ``rlserve.models.distributions.actions.actions_to_json``, vectorised: one
    ``tolist`` per leaf instead of a Python walk per row).
    """
    arr = np.asarray(batched)
    if arr.dtype.kind == "f":
        # JSON has no NaN/inf; the space-JSON convention spells them as strings.
        if not np.all(np.isfinite(arr)):
            return np.vectorize(float_to_json, otypes=[object])(arr.astype(np.float64)).tolist()
        return arr.tolist()
    return arr.astype(np.int64).tolist()




@encode_batch.register
def _(space: gs.Discrete, batched: Any) -> list[Any]:
    return (np.asarray(batched, dtype=np.int64) + int(space.start)).tolist()


@encode_batch.register
def _(space: gs.MultiDiscrete, batched: Any) -> list[Any]:
    return (np.asarray(batched, dtype=np.int64) + space.start.astype(np.int64)).tolist()


@encode_batch.register
def _(space: gs.Box, batched: Any) -> list[Any]:
    if np.dtype(space.dtype).name.startswith("int"):  # RLlib's integer-Box test (uint8 is not)
        return (np.asarray(batched, dtype=np.int64) + int(np.min(space.low))).tolist()
    if np.dtype(space.dtype).kind in "iub":
        return np.asarray(batched).astype(np.int64).tolist()
    return encode_batch.dispatch(object)(space, batched)


@encode_batch.register
def _(space: gs.MultiBinary, batched: Any) -> list[Any]:
    return np.asarray(batched).astype(np.int64).tolist()


@encode_batch.register
def _(space: gs.Tuple, batched: Any) -> list[Any]:
    columns = [encode_batch(sub, part) for sub, part in zip(space.spaces, batched, strict=True)]
    return [list(row) for row in zip(*columns, strict=True)]


@encode_batch.register
def _(space: gs.Dict, batched: Any) -> list[Any]:
    keys = list(space.spaces)
    columns = [encode_batch(space.spaces[k], batched[k]) for k in keys]
    return [dict(zip(keys, row, strict=True)) for row in zip(*columns, strict=True)]


# --------------------------------------------------------------------------- floats

F32_MAX = float(np.finfo(np.float32).max)
# The smallest double that rounds to inf as float32: float32's max plus half its last step
# (the tie rounds to even, i.e. up, since the max has an odd mantissa).
F32_LIMIT = F32_MAX + 2.0 ** 103
_FLOATS_ONLY = {float}


def is_plain_row(data: Any, width: int) -> bool:
    """True when ``data`` is a list of exactly ``width`` Python floats that are all finite
    in float32 -- rows the full decoder would accept unchanged. Anything else (ints, NaN,
    overflow, wrong length) takes the full decoder, which names the problem."""
    if type(data) is not list or len(data) != width or set(map(type, data)) != _FLOATS_ONLY:
        return False
    # The sum is nan or inf if any value is; the bounds keep float32 from overflowing.
    return math.isfinite(sum(data)) and -F32_MAX <= min(data) and max(data) <= F32_MAX


def floats_json(values: np.ndarray | None) -> list[Any] | None:
    """Floats as JSON lists; non-finite entries (JSON has none) become null."""
    if values is None:
        return None
    arr = np.asarray(values, dtype=np.float64)
    if np.isfinite(arr).all():
        return arr.tolist()
    return _nulls(arr.tolist())


def _nulls(value: Any) -> Any:
    if isinstance(value, list):
        return [_nulls(v) for v in value]
    return value if value == value and value not in (float("inf"), float("-inf")) else None
