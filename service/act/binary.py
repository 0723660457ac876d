"""Observation rows as one binary block: base64 in JSON, or the raw request body.

A batch of Box observations is a ``(B, *obs_shape)`` array; sending it as nested JSON
lists costs ~50 ns per number to parse, as per-row base64 objects ~20 us per row. Both
forms here carry the whole array as one buffer, read with one ``numpy.frombuffer``:

- JSON: ``"observations": {"b64": "...", "dtype": "float32", "shape": [B, *obs_shape]}``
  (``ObservationBlock``; every other act field works as with a list of rows);
- raw: ``Content-Type: application/octet-stream``, the array's bytes (C order,
  little-endian) as the body, ``X-Rlserve-Dtype`` and ``X-Rlserve-Shape`` (``B,d1,...``)
  headers, and optionally ``X-Rlserve-Explore`` (``true``/``false``) and
  ``X-Rlserve-Outputs`` (``value,entropy,...``). The answer is the JSON batch form.

The declared shape is held to ``rlserve.service.step.sizes``' rule (the bytes that came,
the row limit, the model's row where known) before numpy sees it; the block's values are
validated as a whole by the preparer (``columns.decode_column``: shape, dtype casts that
lose nothing, finiteness), with errors that name the first bad row.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from typing import Annotated, Any

import msgspec
import numpy as np

from rlserve.service.act.outputs import EXTRA_NAMES
from rlserve.service.errors import InvalidInput, quoted
from rlserve.service.step.rows import Rows
from rlserve.service.step.sizes import Expect, Fields, check_shape

# Numeric dtypes a block may have (little-endian, as numpy names them).
DTYPES = ("float32", "float64", "float16", "uint8", "int8", "uint16", "int16", "uint32", "int32", "int64",
          "uint64", "bool")
_DTYPES = {name: np.dtype(name).newbyteorder("<") for name in DTYPES}
OCTET_STREAM = b"application/octet-stream"
DTYPE_HEADER = b"x-rlserve-dtype"
SHAPE_HEADER = b"x-rlserve-shape"
EXPLORE_HEADER = b"x-rlserve-explore"
OUTPUTS_HEADER = b"x-rlserve-outputs"
_HEADERS = (DTYPE_HEADER, SHAPE_HEADER, EXPLORE_HEADER, OUTPUTS_HEADER)


class ObservationBlock(msgspec.Struct, forbid_unknown_fields=True):
    """A ``(B, *obs_shape)`` array of observations as base64 of its bytes (C order,
    little-endian)."""

    b64: Annotated[str, msgspec.Meta(extra_json_schema={"contentEncoding": "base64"})]
    # Checked by ``block_array`` (a 422 naming the field), documented as the enum it is.
    dtype: Annotated[str, msgspec.Meta(extra_json_schema={"enum": list(DTYPES)})]
    shape: Annotated[list[int], msgspec.Meta(extra_json_schema={
        "minItems": 1, "maxItems": 32, "items": {"type": "integer", "minimum": 1}})]


def block_array(buffer: bytes | memoryview, dtype_name: Any, shape: Any, expect: Expect, fields: Fields,
                dtype_field: str) -> np.ndarray:
    """The ``(B, ...)`` array of a block's bytes (one ``frombuffer``, no copy); its
    dtype, and its shape against the bytes, the row limit and (where known) the model's
    row (``sizes``), are checked before numpy sees the shape; its values against the
    space by the preparer."""
    if dtype_name not in DTYPES:
        raise InvalidInput(f"{dtype_field}: unknown dtype {quoted(dtype_name)}", field=dtype_field,
                           expected=f"one of {list(DTYPES)}", received=dtype_name)
    dtype = _DTYPES[dtype_name]
    check_shape(shape, expect, fields, itemsize=dtype.itemsize, nbytes=len(buffer))
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


_BLOCK_FIELDS = Fields(shape="observations.shape", data="observations.b64")


def decode_block(block: ObservationBlock, max_rows: int) -> np.ndarray:
    """The JSON form's array. Its sessions choose the model version, so the row's shape is
    the preparer's to check; the row limit and the bytes are checked here."""
    try:
        buffer = base64.b64decode(block.b64, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput("observations.b64: invalid base64", field="observations.b64",
                           expected="standard base64 of the array's bytes",
                           received=f"{len(block.b64)} characters that do not decode") from None
    return block_array(buffer, block.dtype, block.shape, Expect(max_rows), _BLOCK_FIELDS, "observations.dtype")


# --------------------------------------------------------------------------- raw body

def is_raw(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """True for a request whose Content-Type is application/octet-stream (ASGI headers).

    A JSON request that carries ``X-Rlserve-*`` headers anyway gets them checked (a 422
    for a malformed one) rather than silently ignored: the documented headers mean the
    same on every act request."""
    raw = ours = False
    for name, value in headers:
        if name == b"content-type":
            raw = value.split(b";", 1)[0].strip().lower() == OCTET_STREAM
        elif name in _HEADERS:
            ours = True
    if ours and not raw:
        _check_headers(_header_values(headers))
    return raw


def _check_headers(values: dict[bytes, str]) -> None:
    dtype, shape = values.get(DTYPE_HEADER), values.get(SHAPE_HEADER)
    if dtype is not None and dtype not in DTYPES:
        raise InvalidInput(f"X-Rlserve-Dtype: unknown dtype {quoted(dtype)}", field="X-Rlserve-Dtype",
                           expected=f"one of {list(DTYPES)}", received=dtype)
    if shape is not None and not _SHAPE.fullmatch(shape):
        raise InvalidInput("X-Rlserve-Shape: expected B,d1,d2,... (1..32 non-negative integers)",
                           field="X-Rlserve-Shape", expected="B,d1,d2,...", received=shape)
    _explore(values.get(EXPLORE_HEADER))
    _outputs(values.get(OUTPUTS_HEADER))


_NO_OUTPUTS: frozenset[str] = frozenset()


class RawOptions(msgspec.Struct, frozen=True):
    explore: bool | None
    outputs: frozenset[str]


def _header_values(headers: Iterable[tuple[bytes, bytes]]) -> dict[bytes, str]:
    return {name: value.decode("latin-1").strip() for name, value in headers if name in _HEADERS}


# At most 32 dimensions of at most 19 digits (int() of a longer one would be a 500).
_SHAPE = re.compile(r"^[0-9]{1,19}(,[0-9]{1,19}){0,31}$")


def _shape(text: str) -> Any:
    """``B,d1,...`` as a list of ints; anything else as received (``check_shape`` refuses it)."""
    return [int(part) for part in text.split(",")] if _SHAPE.fullmatch(text) else text


def _explore(text: str | None) -> bool | None:
    if text is None:
        return None
    value = text.lower()
    if value not in ("true", "false"):
        raise InvalidInput("X-Rlserve-Explore: expected true or false", field="X-Rlserve-Explore",
                           expected=["true", "false"], received=text)
    return value == "true"


def _outputs(text: str | None) -> frozenset[str]:
    if not text:
        return _NO_OUTPUTS
    names = [name.strip() for name in text.split(",") if name.strip()]
    known = EXTRA_NAMES
    unknown = [name for name in names if name not in known]
    if unknown:
        raise InvalidInput(f"X-Rlserve-Outputs: unknown output {quoted(unknown[0])}", field="X-Rlserve-Outputs",
                           expected=f"a comma-separated subset of {list(known)}", received=text)
    return frozenset(names)


_RAW_FIELDS = Fields(shape="X-Rlserve-Shape", data="body")


def raw_rows(headers: Iterable[tuple[bytes, bytes]], body: bytes, expect: Expect) -> tuple[Rows, RawOptions]:
    """A raw body and its headers -> the request's rows (batch form) and options; the
    declared shape must be ``expect``'s (the addressed model's rows, the row limit)."""
    values = _header_values(headers)
    dtype, shape = values.get(DTYPE_HEADER), values.get(SHAPE_HEADER)
    if dtype is None or shape is None:
        missing = "X-Rlserve-Dtype" if dtype is None else "X-Rlserve-Shape"
        raise InvalidInput(f"{missing}: an application/octet-stream act body needs the header {missing}",
                           field=missing, expected="X-Rlserve-Dtype (e.g. float32) and X-Rlserve-Shape (e.g. 64,16)",
                           received="no such header")
    options = RawOptions(_explore(values.get(EXPLORE_HEADER)), _outputs(values.get(OUTPUTS_HEADER)))
    array = block_array(memoryview(body), dtype, _shape(shape), expect, _RAW_FIELDS, "X-Rlserve-Dtype")
    return block_rows(array), options


def block_rows(array: np.ndarray) -> Rows:
    """Rows of a block without per-row fields (the raw form has none)."""
    n = len(array)
    return Rows(single=False, observations=array, session_ids=[None] * n, episode_starts=[False] * n,
                rewards=[None] * n, prev_actions=[msgspec.UNSET] * n, action_masks=[None] * n, seeds=[None] * n,
                has_sessions=False, has_rewards=False, has_prev_actions=False, has_masks=False)
