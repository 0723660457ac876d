"""Container preprocessors: Tuple and Dict flattening, Repeated padding.

Tuple/Dict write their children one after another into a float32 vector (Tuple order;
Dict in the *space's* key order). RLlib sorts the keys of a plain-dict observation and
zips them with the space order, which is the same thing for gymnasium's sorted Dict
spaces; we look each key up by name, which is also right for unsorted spaces.

Repeated writes ``[len, slot0, slot1, ...]`` in float64; slots past ``len`` stay zero.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np
from gymnasium import spaces as gs

from rlserve.models.preprocessing.base import Label, LeafSpec, Preprocessor, join_key, layout_path
from rlserve.models.preprocessing.errors import ObservationError, describe_space, describe_value

__all__ = ["DictFlatteningPreprocessor", "RepeatedValuesPreprocessor", "TupleFlatteningPreprocessor"]


def _items_per_row(
    items: Callable[[Any, str], list[Any]], rows: list[Any], path: str, label: Label
) -> list[list[Any]]:
    """``items(obs, path)`` for every row; an error names the batch row it came from."""
    out = []
    for i, obs in enumerate(rows):
        try:
            out.append(items(obs, path))
        except ObservationError as exc:
            raise ObservationError(exc.path, exc.expected, f"{exc.received} ({label(i)})") from None
    return out


class _Flattening(Preprocessor):
    """Children side by side in one float32 vector."""

    def __init__(self, space: gs.Space, options: Mapping[str, Any], children: list[tuple[str, str, Preprocessor]]):
        super().__init__(space, options)
        # (key part, error-path suffix, child) in output order
        self.children = children
        self.output_shape = (sum(child.size for _, _, child in children),)
        self.output_dtype = np.dtype(np.float32)
        self._placed = []  # (key part, path suffix, child, slice in the output)
        offset = 0
        for part, suffix, child in children:
            self._placed.append((part, suffix, child, slice(offset, offset + child.size)))
            offset += child.size

    def _items(self, obs: Any, path: str) -> list[Any]:
        """The observation's child values in output order, after checking its structure."""
        raise NotImplementedError

    def _slices(self) -> list[tuple[str, str, Preprocessor, slice]]:
        return self._placed

    def _specs(self, key: str, path: str) -> list[LeafSpec]:
        return [s for part, suffix, child in self.children for s in child._specs(join_key(key, part), path + suffix)]

    def _layout(self, key: str, offset: int) -> list[dict[str, Any]]:
        return [
            entry
            for part, _, child, where in self._slices()
            for entry in child._layout(join_key(key, part), offset + where.start)
        ]

    def _write(self, obs: Any, out: np.ndarray, path: str) -> None:
        for value, (_, suffix, child, where) in zip(self._items(obs, path), self._slices(), strict=True):
            child._write(value, out[where], path + suffix)

    def _gather(self, rows: list[Any], key: str, path: str, label: Label) -> dict[str, np.ndarray]:
        per_row = _items_per_row(self._items, rows, path, label)
        cols: dict[str, np.ndarray] = {}
        for j, (part, suffix, child, _) in enumerate(self._slices()):
            cols.update(child._gather([items[j] for items in per_row], join_key(key, part), path + suffix, label))
        return cols

    def _write_columns(
        self, cols: Mapping[str, np.ndarray], key: str, out: np.ndarray, path: str, label: Label
    ) -> None:
        for part, suffix, child, where in self._slices():
            child._write_columns(cols, join_key(key, part), out[:, where], path + suffix, label)


class TupleFlatteningPreprocessor(_Flattening):
    rllib_name = "TupleFlatteningPreprocessor"

    def __init__(self, space: gs.Tuple, options: Mapping[str, Any], build):
        children = [(str(i), f"[{i}]", build(s, options)) for i, s in enumerate(space.spaces)]
        super().__init__(space, options, children)

    def _items(self, obs: Any, path: str) -> list[Any]:
        if not isinstance(obs, Sequence | np.ndarray) or isinstance(obs, str | bytes) or len(obs) != len(self.children):
            raise ObservationError(path, describe_space(self.original_space), describe_value(obs))
        return list(obs)


class DictFlatteningPreprocessor(_Flattening):
    rllib_name = "DictFlatteningPreprocessor"

    def __init__(self, space: gs.Dict, options: Mapping[str, Any], build):
        children = [(str(k), f".{k}", build(s, options)) for k, s in space.spaces.items()]
        self._keys = list(space.spaces)
        super().__init__(space, options, children)

    def _items(self, obs: Any, path: str) -> list[Any]:
        if not isinstance(obs, Mapping):
            raise ObservationError(path, describe_space(self.original_space), describe_value(obs))
        missing = [k for k in self._keys if k not in obs]
        if missing:
            raise ObservationError(f"{path}.{missing[0]}", "a value (the key is required)", "no such key")
        extra = [k for k in obs if k not in cast(gs.Dict, self.original_space).spaces]
        if extra:
            raise ObservationError(
                path, describe_space(self.original_space), f"unexpected key(s) {sorted(map(str, extra))}"
            )
        return [obs[k] for k in self._keys]


class RepeatedValuesPreprocessor(Preprocessor):
    """``[len, slot0, ..., slot_{max_len-1}]`` in float64; unused slots all zero."""

    rllib_name = "RepeatedValuesPreprocessor"

    def __init__(self, space: Any, options: Mapping[str, Any], build):
        super().__init__(space, options)
        self.child = build(space.child_space, options)
        self.max_len = int(space.max_len)
        self.output_shape = (1 + self.child.size * self.max_len,)
        self.output_dtype = np.dtype(np.float64)

    def _expected(self) -> str:
        return describe_space(self.original_space)

    def _specs(self, key: str, path: str) -> list[LeafSpec]:
        items = self.child._specs(join_key(key, "__items__"), f"{path}[*]")
        return [LeafSpec(join_key(key, "__len__"), f"{path}.__len__", ())] + [
            LeafSpec(s.key, s.path, (self.max_len, *s.trailing)) for s in items
        ]

    def _layout(self, key: str, offset: int) -> list[dict[str, Any]]:
        items_key = join_key(key, "__items__")
        return [
            {"path": layout_path(join_key(key, "__len__")), "preprocessor": "length-slot", "offset": offset, "size": 1},
            {
                "path": layout_path(items_key),
                "preprocessor": self.rllib_name,
                "offset": offset + 1,
                "size": self.size - 1,
                "slot_stride": self.child.size,
                "max_len": self.max_len,
                "child_layout": self.child._layout(items_key, 0),
            },
        ]

    def _items(self, obs: Any, path: str) -> list[Any]:
        scalar_array = isinstance(obs, np.ndarray) and obs.ndim == 0
        if isinstance(obs, str | bytes | Mapping) or not isinstance(obs, Sequence | np.ndarray) or scalar_array:
            raise ObservationError(path, self._expected(), describe_value(obs))
        if len(obs) > self.max_len:
            raise ObservationError(path, self._expected(), f"a list of {len(obs)} items")
        return list(obs)

    def _write(self, obs: Any, out: np.ndarray, path: str) -> None:
        items = self._items(obs, path)
        out[0] = len(items)
        stride = self.child.size
        for i, item in enumerate(items):
            self.child._write(item, out[1 + i * stride: 1 + (i + 1) * stride], f"{path}[{i}]")

    def _gather(self, rows: list[Any], key: str, path: str, label: Label) -> dict[str, np.ndarray]:
        lists = _items_per_row(self._items, rows, path, label)
        lengths = np.array([len(items) for items in lists], dtype=np.int64)
        row_of = np.repeat(np.arange(len(rows)), lengths)
        item_of = np.concatenate([np.arange(n) for n in lengths]) if len(rows) else np.zeros(0, np.int64)
        flat_items = [item for items in lists for item in items]
        child_cols = self.child._gather(
            flat_items, join_key(key, "__items__"), f"{path}[*]",
            lambda j: f"{label(int(row_of[j]))}, item {int(item_of[j])}",
        )
        mask = np.arange(self.max_len) < lengths[:, None]
        cols = {join_key(key, "__len__"): lengths}
        for k, arr in child_cols.items():
            padded = np.zeros((len(rows), self.max_len, *arr.shape[1:]), dtype=arr.dtype)
            padded[mask] = arr
            cols[k] = padded
        return cols

    def _write_columns(
        self, cols: Mapping[str, np.ndarray], key: str, out: np.ndarray, path: str, label: Label
    ) -> None:
        lengths = self._check_lengths(cols[join_key(key, "__len__")], path, label)
        n = len(lengths)
        mask = np.arange(self.max_len) < lengths[:, None]
        rows, slots = np.nonzero(mask)
        # Only real items are validated and transformed: padding holds zeros that need
        # not fit the child space (a padded Discrete(start=5) slot holds 0).
        child_keys = [s.key for s in self.child._specs(join_key(key, "__items__"), path)]
        child_cols = {k: cols[k][mask] for k in child_keys}
        child_out = np.zeros((len(rows), self.child.size), dtype=out.dtype)
        if len(rows):
            self.child._write_columns(
                child_cols, join_key(key, "__items__"), child_out, f"{path}[*]",
                lambda j: f"{label(int(rows[j]))}, item {int(slots[j])}",
            )
        slots_out = np.zeros((n, self.max_len, self.child.size), dtype=out.dtype)
        slots_out[mask] = child_out
        out[:, 0] = lengths
        out[:, 1:] = slots_out.reshape(n, -1)

    def _check_lengths(self, lengths: np.ndarray, path: str, label: Label) -> np.ndarray:
        if lengths.dtype.kind not in "iu":
            raise ObservationError(f"{path}.__len__", "integer list lengths", f"a column of dtype {lengths.dtype.name}")
        bad = (lengths < 0) | (lengths > self.max_len)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise ObservationError(
                f"{path}.__len__", f"a length in [0, {self.max_len}]", f"{int(lengths[row])} ({label(row)})"
            )
        return lengths.astype(np.int64)
