"""Leaf preprocessors: one array per observation in, one flat block out.

Each leaf validates a raw value (``_convert_one`` for one observation, ``_check_column``
for a column) and computes its block with one vectorised ``_compute`` over ``(N, ...)``
rows, so a single observation and a batch go through the same arithmetic.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, cast

import numpy as np
from gymnasium import spaces as gs

from rlserve.models.preprocessing.base import Label, LeafSpec, Preprocessor, layout_path
from rlserve.models.preprocessing.errors import ObservationError, describe_space, describe_value
from rlserve.models.spaces import shape_of

__all__ = [
    "AtariRamPreprocessor",
    "LeafPreprocessor",
    "NoPreprocessor",
    "OneHotPreprocessor",
]

_NUMERIC_KINDS = "biuf"


class LeafPreprocessor(Preprocessor):
    """A leaf: raw values of shape ``trailing`` per observation."""

    is_leaf: ClassVar[bool] = True
    # dtype kinds a raw value may have (b: bool, i/u: integers, f: floats)
    accepted_kinds: ClassVar[str] = _NUMERIC_KINDS
    # np.asarray([1, True]) is an int array: leaves that reject bools look at each row.
    _rejects_bool: ClassVar[bool] = False

    @property
    def trailing(self) -> tuple[int, ...]:
        return shape_of(self.original_space)

    def _column_dtype(self) -> np.dtype:
        """The dtype of an empty column (no rows to infer it from)."""
        return np.dtype(self.original_space.dtype)

    def _compute(self, raw: np.ndarray) -> np.ndarray:
        """``(N, *trailing)`` validated raw values -> ``(N, size)`` in the leaf's own dtype."""
        raise NotImplementedError

    def _check_values(self, arr: np.ndarray, path: str, label: Label) -> None:
        """Value checks beyond dtype and shape (ranges); ``arr`` is ``(N, *trailing)``."""

    # -------------------------------------------------------------- validation

    def _expected(self) -> str:
        return describe_space(self.original_space)

    def _convert_one(self, obs: Any, path: str) -> np.ndarray:
        try:
            arr = np.asarray(obs)
        except (ValueError, TypeError):
            raise ObservationError(path, self._expected(), describe_value(obs)) from None
        if arr.dtype.kind not in self.accepted_kinds or arr.shape != self.trailing:
            raise ObservationError(path, self._expected(), describe_value(obs if arr.dtype == object else arr))
        self._check_values(arr[None], path, lambda i: "")
        return arr

    def _check_column(self, arr: np.ndarray, path: str, label: Label) -> None:
        if arr.dtype.kind not in self.accepted_kinds:
            raise ObservationError(path, self._expected(), f"a column of dtype {arr.dtype.name}")
        self._check_values(arr, path, label)

    # -------------------------------------------------------------- node protocol

    def _specs(self, key: str, path: str) -> list[LeafSpec]:
        return [LeafSpec(key, path, self.trailing)]

    def _layout(self, key: str, offset: int) -> list[dict[str, Any]]:
        return [{
            "path": layout_path(key),
            "preprocessor": self.rllib_name,
            "offset": offset,
            "size": self.size,
            "output_shape": list(self.output_shape),
        }]

    def _write(self, obs: Any, out: np.ndarray, path: str) -> None:
        raw = self._convert_one(obs, path)
        out[:] = self._compute(raw[None]).reshape(-1)

    def _gather(self, rows: list[Any], key: str, path: str, label: Label) -> dict[str, np.ndarray]:
        if not rows:
            return {key: np.zeros((0, *self.trailing), dtype=self._column_dtype())}
        try:
            arr = np.asarray(rows)
        except (ValueError, TypeError):
            arr = None
        if arr is None or arr.dtype.kind not in self.accepted_kinds or arr.shape[1:] != self.trailing or (
            self._rejects_bool and any(isinstance(obs, bool | np.bool_) for obs in rows)
        ):
            # Find the offending row for the message; the fast path found none to blame.
            for i, obs in enumerate(rows):
                try:
                    self._convert_one(obs, path)
                except ObservationError as exc:
                    raise ObservationError(exc.path, exc.expected, f"{exc.received}{_at(label, i)}") from None
            raise ObservationError(path, self._expected(), "values of mixed types")
        return {key: arr.reshape((len(rows), *self.trailing))}

    def _write_columns(
        self, cols: Mapping[str, np.ndarray], key: str, out: np.ndarray, path: str, label: Label
    ) -> None:
        arr = cols[key]
        self._check_column(arr, path, label)
        out[:] = self._compute(arr).reshape(len(arr), -1)


def _at(label: Label, row: int) -> str:
    text = label(row)
    return f" ({text})" if text else ""


def _first_bad(bad: np.ndarray) -> tuple[int, tuple[int, ...]]:
    """Row and within-row index of the first True in an ``(N, ...)`` mask."""
    flat = int(np.flatnonzero(bad.reshape(-1))[0])
    idx = np.unravel_index(flat, bad.shape)
    return int(idx[0]), tuple(int(v) for v in idx[1:])


class NoPreprocessor(LeafPreprocessor):
    """Box, MultiBinary, Simplex: the raw values, C-order, in the space's own dtype."""

    rllib_name = "NoPreprocessor"
    passes_space_through = True

    def __init__(self, space: gs.Space, options: Mapping[str, Any]):
        super().__init__(space, options)
        self.output_shape = shape_of(space)
        self.output_dtype = np.dtype(space.dtype)

    def _check_values(self, arr: np.ndarray, path: str, label: Label) -> None:
        # Box bounds are not enforced (RLlib does not either); MultiBinary must be 0/1.
        if isinstance(self.original_space, gs.MultiBinary):
            bad = (arr != 0) & (arr != 1)
            if bad.any():
                row, idx = _first_bad(bad)
                value = arr[row][idx] if idx else arr[row]
                raise ObservationError(path, self._expected(), f"{value!r} at index {list(idx)}{_at(label, row)}")

    def _compute(self, raw: np.ndarray) -> np.ndarray:
        return raw.reshape(len(raw), -1)


class OneHotPreprocessor(LeafPreprocessor):
    """Discrete: one-hot of ``x - start``; MultiDiscrete: concatenated one-hots."""

    rllib_name = "OneHotPreprocessor"
    accepted_kinds = "iu"
    _rejects_bool = True

    def __init__(self, space: gs.Discrete | gs.MultiDiscrete, options: Mapping[str, Any]):
        super().__init__(space, options)
        if isinstance(space, gs.Discrete):
            self._n = np.array([int(space.n)])
            self._start = np.array([int(space.start)])
        else:
            self._n = space.nvec.reshape(-1).astype(np.int64)
            self._start = space.start.reshape(-1).astype(np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(self._n)[:-1]])
        self.output_shape = (int(self._n.sum()),)
        self.output_dtype = np.dtype(np.float32)

    @property
    def trailing(self) -> tuple[int, ...]:
        return (
            ()
            if isinstance(self.original_space, gs.Discrete)
            else tuple(cast(gs.MultiDiscrete, self.original_space).nvec.shape)
        )

    def _convert_one(self, obs: Any, path: str) -> np.ndarray:
        # Python bools are ints; a bool where a category index belongs is a client bug.
        if isinstance(obs, bool | np.bool_):
            raise ObservationError(path, self._expected(), describe_value(obs))
        return super()._convert_one(obs, path)

    def _check_values(self, arr: np.ndarray, path: str, label: Label) -> None:
        flat = arr.reshape(len(arr), -1).astype(np.int64)
        bad = (flat < self._start) | (flat >= self._start + self._n)
        if bad.any():
            row, (col,) = _first_bad(bad)
            where = f" at index {list(np.unravel_index(col, self.trailing))}" if self.trailing else ""
            raise ObservationError(path, self._expected(), f"{int(flat[row, col])}{where}{_at(label, row)}")

    def _compute(self, raw: np.ndarray) -> np.ndarray:
        flat = raw.reshape(len(raw), -1).astype(np.int64)
        out = np.zeros((len(raw), self.size), dtype=np.float32)
        rows = np.arange(len(raw))[:, None]
        out[rows, self._offsets + flat - self._start] = 1.0
        return out


class AtariRamPreprocessor(LeafPreprocessor):
    """Any non-discrete space of shape (128,): ``(x - 128) / 128`` in float32."""

    rllib_name = "AtariRamPreprocessor"

    def __init__(self, space: gs.Space, options: Mapping[str, Any]):
        super().__init__(space, options)
        self.output_shape = (128,)
        self.output_dtype = np.dtype(np.float32)

    def _compute(self, raw: np.ndarray) -> np.ndarray:
        return (raw.astype(np.float32) - 128) / 128
