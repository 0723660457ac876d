"""Declared sizes, checked before anything is allocated for them.

Some bodies declare the size of what they carry: the raw act body's ``X-Rlserve-Shape``
and ``X-Rlserve-Dtype`` headers, the base64 block's ``shape`` and ``dtype``, an Open
Inference Protocol input's ``shape``, ``datatype`` and ``parameters.binary_data_size``
(JSON, binary and gRPC). A declared size is a claim; the bytes that came are a fact. A
size that does not fit them must not reach numpy (which would reshape, or the lists built
per row, in proportion to the claim), so ``check_shape`` holds every claim to one rule:

- every dimension is a non-negative integer, and products are Python integers (no
  overflow, whatever was declared);
- a row has the model's shape where the model is known at that point; where it is not
  yet (a JSON block, whose sessions choose the version), no dimension may be 0: a
  zero-width shape holds nothing and would let every other dimension be anything;
- the element count times the item size is the number of bytes that came (or the
  element count is the number of values, for inline JSON data);
- last, the rows (the first dimension) are 1..``max_rows`` (``RLSERVE_MAX_ROWS``): past
  the checks above, the body really holds them, and the refusal is a 413.

Each refusal names the field, what was expected and what was received. ``check_rows`` is
the row limit alone, for the forms whose rows are a list the body holds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlserve.service.errors import InvalidInput, PayloadTooLarge, ServiceError

Shape = tuple[int, ...]
_MAX_DIMS = 32  # numpy's own limit is 64; no observation has more than a few


@dataclass(frozen=True, slots=True)
class Expect:
    """What a declared ``(B, *row)`` shape must be: B in 1..``max_rows`` and, when known,
    the row one of ``rows`` (a scalar leaf takes ``()`` and ``(1,)``)."""

    max_rows: int
    rows: tuple[Shape, ...] | None = None  # None: the model is not known here yet
    batch: str | int = "B"  # how the batch dimension is written (the Open Inference Protocol's -1)

    def shapes(self) -> list[list[str | int]]:
        assert self.rows is not None
        return [[self.batch, *row] for row in self.rows]

    def row_text(self) -> str:
        return " or ".join(f"[{', '.join(map(str, shape))}]" for shape in self.shapes())


@dataclass(frozen=True, slots=True)
class Fields:
    """The names a refusal gives: the declared shape, the data it claims to describe, and
    how messages name the input (default: by the field at fault)."""

    shape: str
    data: str
    where: str | None = None


def check_rows(rows: int, max_rows: int, field: str) -> None:
    """413 when a request carries more rows than one request may."""
    if rows > max_rows:
        raise PayloadTooLarge(f"{field}: {rows} rows exceed the limit of {max_rows} rows per request "
                              "(RLSERVE_MAX_ROWS); split the batch", field=field,
                              expected=f"at most {max_rows} rows", received=f"{rows} rows")


def check_shape(shape: Any, expect: Expect, fields: Fields, *, itemsize: int | None = None,
                nbytes: int | None = None, elements: int | None = None,
                error: type[ServiceError] = InvalidInput) -> int:
    """The element count of ``shape`` once it passed the rule above. What came is compared
    when given: ``nbytes`` bytes of ``itemsize`` each, or ``elements`` values (inline JSON
    data). Raises ``error`` (or 413 for too many rows) naming the field."""
    dims = _dims(shape, fields, error)
    row = dims[1:]
    where = fields.where or fields.shape
    if expect.rows is not None:
        if row not in expect.rows:
            shapes = expect.shapes()
            raise error(f"{where}: shape {list(dims)} does not fit the model's {expect.row_text()}",
                        field=fields.shape, expected=shapes[0] if len(shapes) == 1 else shapes, received=list(dims))
    elif 0 in row:
        raise error(f"{where}: shape {list(dims)} has a dimension of 0 (it holds no observation)",
                    field=fields.shape, expected="[B, *observation_shape] with every dimension >= 1",
                    received=list(dims))
    count = math.prod(dims)
    if nbytes is not None:
        assert itemsize is not None
        if count * itemsize != nbytes:
            raise error(f"{fields.where or fields.data}: {nbytes} bytes do not hold shape {list(dims)} of "
                        f"{itemsize}-byte elements ({count * itemsize} bytes)", field=fields.data,
                        expected=f"{count * itemsize} bytes", received=f"{nbytes} bytes")
    if elements is not None and count != elements:
        raise error(f"{fields.where or fields.data}: {elements} elements came, but shape {list(dims)} needs "
                    f"{count}", field=fields.data, expected=count, received=elements)
    # Last: past the checks above the rows are really there (the body holds them).
    check_rows(dims[0], expect.max_rows, fields.shape)
    return count


def _dims(shape: Any, fields: Fields, error: type[ServiceError]) -> Shape:
    where = fields.where or fields.shape
    if (not isinstance(shape, Sequence) or isinstance(shape, str | bytes) or not 1 <= len(shape) <= _MAX_DIMS
            or not all(type(d) is int and d >= 0 for d in shape)):
        received = f"{len(shape)} dimensions" if isinstance(shape, Sequence) and len(shape) > _MAX_DIMS else shape
        raise error(f"{where}: expected the shape [B, *observation_shape]: 1..{_MAX_DIMS} non-negative integers",
                    field=fields.shape, expected=f"1..{_MAX_DIMS} non-negative integers, B >= 1", received=received)
    if shape[0] < 1:
        raise error(f"{where}: shape {list(shape)} has no rows", field=fields.shape, expected="B >= 1 rows",
                    received=list(shape))
    return tuple(shape)
