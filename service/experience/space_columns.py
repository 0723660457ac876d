"""How a space's values are stored in a Parquet column (pyarrow types and arrays).

RLlib's own recordings hold each observation and action as the space's value: a Box as
an array of its dtype and shape, a Discrete as an integer. Here a Box of shape ``()`` is a
scalar column, any other Box nested fixed-size lists of its dtype (one level per axis),
Discrete an int64, MultiDiscrete and MultiBinary a fixed-size list of int64. A composite
space (Dict, Tuple, ...) is a JSON string of the value as the API takes it, which RLlib's
reader does not decode by itself (docs/experience.md).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
from gymnasium import spaces as gs


def arrow_type(space: Any) -> pa.DataType:
    if isinstance(space, gs.Box):
        kind: pa.DataType = pa.from_numpy_dtype(np.dtype(space.dtype))
        for size in reversed(space.shape):
            kind = pa.list_(kind, size)
        return kind
    if isinstance(space, gs.Discrete):
        return pa.int64()
    if isinstance(space, gs.MultiDiscrete | gs.MultiBinary):
        return pa.list_(pa.int64(), int(np.prod(space.shape)))
    return pa.string()


def arrow_array(space: Any, values: list[Any]) -> pa.Array:
    """One column of ``values`` (each as ``records.packer`` keeps it)."""
    kind = arrow_type(space)
    if isinstance(space, gs.Box | gs.MultiDiscrete | gs.MultiBinary):
        stacked = stack(space, values)
        array: pa.Array = pa.array(stacked.reshape(-1))
        for size in reversed(stacked.shape[1:]):
            array = pa.FixedSizeListArray.from_arrays(array, size)
        return array.cast(kind)
    if isinstance(space, gs.Discrete):
        return pa.array(np.asarray(values, dtype=np.int64))
    return pa.array([json.dumps(_jsonable(v)) for v in values], type=kind)


def stack(space: Any, values: list[Any]) -> Any:
    """Packed values (``records.packer``) as one array (N, *shape) of the space's dtype, one
    conversion for all; a list of the JSON values for a composite space."""
    if isinstance(space, gs.Box | gs.MultiDiscrete | gs.MultiBinary):
        dtype = np.dtype(space.dtype) if isinstance(space, gs.Box) else np.dtype(np.int64)
        return np.frombuffer(b"".join(values), dtype=dtype).reshape(len(values), *space.shape)
    if isinstance(space, gs.Discrete):
        return np.asarray(values, dtype=np.int64).reshape(len(values))
    return list(values)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value
