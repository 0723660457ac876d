"""Tensors on the wire: the protocol's datatypes, inline JSON ``data`` and binary buffers.

Binary tensor data (Triton's extension) is little-endian, row-major, without padding; a
request's binary inputs follow its JSON header in the order of ``inputs``, each
``parameters.binary_data_size`` bytes long. They are read with ``numpy.frombuffer``: a
view of the request body, no copy (the batch copies the rows once, into the model input).
Outputs go back the same way when asked for (``binary_data``), else as flat JSON lists.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np

from rlserve.service.errors import BadRequest, quoted
from rlserve.service.protocols.kserve_v2.wire import (
    InferRequestInput,
    InferResponseOutput,
    Parameters,
)
from rlserve.service.step.received import describe, leaves
from rlserve.service.step.sizes import Expect, Fields, check_shape

# The protocol's datatypes as (little-endian) numpy dtypes. BYTES (length-prefixed
# strings) has no numeric meaning for a policy and is refused where it is received.
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"), "UINT16": np.dtype("<u2"), "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"), "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
}
_NAMES = {dtype: name for name, dtype in DATATYPES.items()}
_INLINE_KIND = {"b": "b", "u": "iu", "i": "iu", "f": "iuf"}  # JSON numbers each datatype takes inline
_FP64_MAX = float(np.finfo(np.float64).max)


def datatype_of(dtype: np.dtype) -> str:
    """The protocol's name for a numpy dtype (native byte order)."""
    name = _NAMES.get(np.dtype(dtype).newbyteorder("<"))
    if name is None:
        raise ValueError(f"dtype {np.dtype(dtype).name} has no Open Inference Protocol datatype")
    return name


def _describe(inp: InferRequestInput) -> str:
    return f"input '{inp.name}'"


def read_input(inp: InferRequestInput, binary: memoryview, offset: int, expect: Expect) -> tuple[np.ndarray, int]:
    """The tensor of ``inp`` shaped as sent, and the offset after its binary data (if any).

    Binary data is a read-only view of ``binary``; inline data a new array. The datatype,
    and the declared shape against ``expect`` (the model's row, the row limit) and the
    bytes or data that came (``sizes``), are checked before anything is read; the
    values against the space later."""
    where = _describe(inp)
    dtype = DATATYPES.get(inp.datatype)
    if dtype is None:
        if inp.datatype == "BYTES":
            raise BadRequest(f"{where}: BYTES tensors are not supported; send numbers (FP32, INT64, UINT8, ...)",
                             field=f"{inp.name}.datatype", expected=sorted(DATATYPES), received="BYTES")
        raise BadRequest(f"{where}: unknown datatype {quoted(inp.datatype)}", field=f"{inp.name}.datatype",
                         expected=sorted(DATATYPES), received=inp.datatype)
    size = inp.parameters.get("binary_data_size") if inp.parameters else None
    if size is None:
        return _inline(inp, dtype, expect), offset
    if type(size) is not int or size < 0:
        raise BadRequest(f"{where}: binary_data_size must be a non-negative integer",
                         field=f"{inp.name}.parameters.binary_data_size", expected="an integer >= 0", received=size)
    if inp.data is not msgspec.UNSET:
        raise BadRequest(f"{where}: has both 'data' and binary_data_size; send one", field=f"{inp.name}.data",
                         expected="either inline data or binary data", received="both")
    end = offset + size
    if end > len(binary):
        raise BadRequest(
            f"{where}: its binary data would end at byte {end} after the JSON header, but only {len(binary)} "
            "bytes follow it (check Inference-Header-Content-Length)",
            field=f"{inp.name}.parameters.binary_data_size", expected=f"{end} bytes of binary data",
            received=f"{len(binary)} bytes")
    fields = Fields(f"{inp.name}.shape", f"{inp.name}.parameters.binary_data_size", where)
    count = check_shape(inp.shape, expect, fields, itemsize=dtype.itemsize, nbytes=size, error=BadRequest)
    return np.frombuffer(binary, dtype=dtype, count=count, offset=offset).reshape(inp.shape), end


def _inline(inp: InferRequestInput, dtype: np.dtype, expect: Expect) -> np.ndarray:
    """Inline ``data`` (held by the body: its size is the body's), then its declared shape
    against ``expect`` and the values that came, before it is reshaped."""
    where = _describe(inp)
    data = inp.data
    if data is msgspec.UNSET:
        raise BadRequest(f"{where}: no data; send 'data' or binary data (parameters.binary_data_size)",
                         field=f"{inp.name}.data", expected="an array of numbers", received=None)
    if not isinstance(data, list):
        raise BadRequest(f"{where}: 'data' must be an array", field=f"{inp.name}.data",
                         expected="an array of numbers", received=type(data).__name__)
    try:
        arr = np.asarray(data)
    except (ValueError, TypeError):
        arr = None
    if arr is None or arr.dtype.kind not in _INLINE_KIND[dtype.kind]:
        # Not one array of the datatype's numbers: integers past int64 (numpy makes them
        # float64, rounded, or objects), booleans for numbers, or a misfit to name.
        arr = _exact(inp, data, dtype)
    check_shape(inp.shape, expect, Fields(f"{inp.name}.shape", f"{inp.name}.data", where),
                elements=arr.size, error=BadRequest)
    if dtype.kind in "iu" and arr.size:
        info = np.iinfo(dtype)
        low, high = arr.min(), arr.max()
        if low < info.min or high > info.max:
            raise BadRequest(f"{where}: 'data' holds {low if low < info.min else high}, outside {inp.datatype}",
                             field=f"{inp.name}.data", expected=f"integers in [{info.min}, {info.max}]",
                             received=(low if low < info.min else high).item())
    with np.errstate(over="ignore"):  # a float beyond FP32 becomes inf; the leaf check refuses it
        return arr.astype(dtype, copy=False).reshape(inp.shape)


def _exact(inp: InferRequestInput, data: list[Any], dtype: np.dtype) -> np.ndarray:
    """``data`` as ``dtype`` with every element checked in order (exact for UINT64's
    values past int64); a 400 naming the first element ``dtype`` cannot hold."""
    where, kind = _describe(inp), dtype.kind
    what = "booleans" if kind == "b" else "integers" if kind in "iu" else "finite numbers"
    # Python numbers: a 400-digit integer compares with them exactly (numpy's would overflow).
    low, high = (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max)) if kind in "iu" else (-_FP64_MAX, _FP64_MAX)
    for path, value in leaves(data):
        element = f"element {path[0] if len(path) == 1 else path}"
        if isinstance(value, bool) is not (kind == "b") or not isinstance(value, int | float) or (
                kind in "iu" and isinstance(value, float)):  # booleans only for BOOL; no fractions for integers
            got = f"{element} is {describe(value)}"
            raise BadRequest(f"{where}: 'data' of {inp.datatype} must hold {what}; {got}",
                             field=f"{inp.name}.data", expected=f"{what} for {inp.datatype}", received=got)
        if kind != "b" and isinstance(value, int) and not low <= value <= high:
            expected = f"integers in [{low}, {high}]" if kind in "iu" else f"numbers within +-{high:g}"
            raise BadRequest(f"{where}: 'data' {element} is {value}, outside {inp.datatype}",
                             field=f"{inp.name}.data", expected=expected, received=value)
    try:  # every element fits: only the nesting can be wrong
        return np.array(data, dtype=dtype if kind in "iub" else np.float64)
    except ValueError:
        raise BadRequest(f"{where}: 'data' of {inp.datatype} must hold {what}; the nested lists' lengths differ",
                         field=f"{inp.name}.data", expected=f"{what} for {inp.datatype}",
                         received="the nested lists' lengths differ") from None


def wire_array(arr: np.ndarray, datatype: str) -> np.ndarray:
    """``arr`` as an output's datatype, C-ordered: what its bytes on the wire are made of."""
    return np.ascontiguousarray(arr, dtype=DATATYPES[datatype])


def write_output(name: str, arr: np.ndarray, datatype: str, binary: bool, blobs: list[bytes]) -> InferResponseOutput:
    """``arr`` (B, ...) as a response output; binary data is appended to ``blobs``."""
    arr = wire_array(arr, datatype)
    shape = list(arr.shape)
    if binary:
        raw = arr.tobytes()
        blobs.append(raw)
        params: Parameters = {"binary_data_size": len(raw)}
        return InferResponseOutput(name=name, datatype=datatype, shape=shape, parameters=params)
    data: list[Any] = arr.ravel().tolist()
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        # JSON has no NaN or infinities: those elements are null (the JSON API's convention).
        data = [x if math.isfinite(x) else None for x in data]
    return InferResponseOutput(name=name, datatype=datatype, shape=shape, data=data)
