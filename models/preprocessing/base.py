"""The ``Preprocessor`` contract shared by every leaf and container preprocessor.

A preprocessor turns one structured observation (what gymnasium produces: arrays, ints,
tuples, dicts, lists for Repeated) into RLlib's flat vector, and does the same for a
columnar batch: one array per leaf with leading batch axes, keyed like the oracle's
``obs/<path>`` io keys (``""`` for a root leaf, ``"sensors/2/b"``, ``"items/__len__"``,
``"items/__items__/pos"``).

Every node implements four small methods; containers delegate to their children:

- ``_write(obs, out, path)``: one observation into the 1-D slice ``out``;
- ``_gather(rows, key, path, label)``: a list of observations into columns ``{key: (N, ...)}``;
- ``_write_columns(cols, key, out, path, label)``: columns into the 2-D slice ``out (N, size)``;
- ``_specs(key, path)`` / ``_layout(where, offset)``: the leaves, for key checks and layout.

Values are written into the *top-level* preprocessor's output dtype, exactly as RLlib's
``write`` assigns each leaf's own result into the container's array.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces as gs

from rlserve.models.preprocessing.errors import ObservationError

__all__ = ["Label", "LeafSpec", "Preprocessor", "join_key", "layout_path"]

# Names a row of a batch in error messages ("batch row 3", "batch row 3, item 1").
Label = Callable[[int], str]

ROOT_PATH = "obs"


@dataclass(frozen=True)
class LeafSpec:
    """One column of a columnar batch: its key, error path and per-row trailing shape."""

    key: str
    path: str
    trailing: tuple[int, ...]


def join_key(key: str, part: str) -> str:
    return part if key == "" else f"{key}/{part}"


def layout_path(key: str) -> str:
    return ROOT_PATH if key == "" else f"{ROOT_PATH}/{key}"


def _row_label(lead: tuple[int, ...]) -> Label:
    if len(lead) <= 1:
        return lambda i: f"batch row {i}"
    return lambda i: "batch index " + str(tuple(int(v) for v in np.unravel_index(i, lead)))


class Preprocessor:
    """RLlib's preprocessor for one space; see the module docstring for the node protocol.

    Public attributes: ``original_space``, ``options`` (dim/grayscale/zero_mean),
    ``output_shape``, ``output_dtype``, ``size``, ``observation_space``, ``layout``.
    """

    rllib_name: ClassVar[str] = "Preprocessor"
    # NoPreprocessor hands the model the raw space itself, without ``original_space``.
    passes_space_through: ClassVar[bool] = False
    # Leaves take one array per observation; containers take structures.
    is_leaf: ClassVar[bool] = False

    output_shape: tuple[int, ...]
    output_dtype: np.dtype

    def __init__(self, space: gs.Space, options: Mapping[str, Any]):
        self.original_space = space
        self.options = {k: options[k] for k in ("dim", "grayscale", "zero_mean")}

    @property
    def name(self) -> str:
        return self.rllib_name

    @functools.cached_property
    def size(self) -> int:
        # Cached: containers ask for their children's sizes on every observation.
        return int(np.prod(self.output_shape, dtype=np.int64))

    @property
    def observation_space(self) -> gs.Space:
        """The space the model is built for: a flat Box carrying ``original_space``."""
        if self.passes_space_through:
            return self.original_space
        box = gs.Box(-1.0, 1.0, self.output_shape, dtype=np.float32)
        box.original_space = self.original_space  # type: ignore[attr-defined]
        return box

    @property
    def layout(self) -> list[dict[str, Any]]:
        """Where each leaf sits in the flat output (case.json ``preprocessor.layout``)."""
        return self._layout("", 0)

    def __repr__(self) -> str:
        return f"{self.rllib_name}({self.original_space!r} -> {self.output_shape} {self.output_dtype.name})"

    # ------------------------------------------------------------------ public transforms

    def transform(self, obs: Any) -> np.ndarray:
        """One structured observation -> ``output_shape`` array of ``output_dtype``."""
        out = np.zeros(self.size, dtype=self.output_dtype)
        self._write(obs, out, ROOT_PATH)
        return out.reshape(self.output_shape)

    def transform_batch(self, rows: Sequence[Any]) -> np.ndarray:
        """A list of structured observations -> ``(N, *output_shape)``."""
        if isinstance(rows, np.ndarray) and self.is_leaf:
            return self.transform_columns({"": rows})
        rows = list(rows)
        cols = self._gather(rows, "", ROOT_PATH, _row_label((len(rows),)))
        out = np.zeros((len(rows), self.size), dtype=self.output_dtype)
        if rows:
            self._write_columns(cols, "", out, ROOT_PATH, _row_label((len(rows),)))
        return out.reshape((len(rows), *self.output_shape))

    def transform_columns(self, columns: Mapping[str, Any]) -> np.ndarray:
        """Columns ``{key: (*lead, *leaf_shape)}`` -> ``(*lead, *output_shape)``.

        ``lead`` is any number of leading axes (``[B]``, or ``[T, B]`` for recurrent io),
        taken from the first leaf and required of every other.
        """
        specs = self._specs("", ROOT_PATH)
        self._check_keys(columns, specs)
        arrays, lead = self._flatten_lead(columns, specs)
        n = int(np.prod(lead, dtype=np.int64))
        out = np.zeros((n, self.size), dtype=self.output_dtype)
        if n:
            self._write_columns(arrays, "", out, ROOT_PATH, _row_label(lead))
        return out.reshape((*lead, *self.output_shape))

    @staticmethod
    def _check_keys(columns: Mapping[str, Any], specs: list[LeafSpec]) -> None:
        expected = {s.key: s for s in specs}
        for spec in specs:
            if spec.key not in columns:
                raise ObservationError(spec.path, f"a column under key {spec.key!r}", "no such column")
        extra = sorted(set(columns) - set(expected))
        if extra:
            raise ObservationError(
                ROOT_PATH, f"columns {sorted(expected)}", f"unexpected column(s) {extra}"
            )

    @staticmethod
    def _flatten_lead(
        columns: Mapping[str, Any], specs: list[LeafSpec]
    ) -> tuple[dict[str, np.ndarray], tuple[int, ...]]:
        lead: tuple[int, ...] | None = None
        arrays: dict[str, np.ndarray] = {}
        for spec in specs:
            arr = np.asarray(columns[spec.key])
            nlead = arr.ndim - len(spec.trailing)
            if nlead < 0 or arr.shape[nlead:] != spec.trailing:
                raise ObservationError(
                    spec.path,
                    f"a column of shape (*batch, {', '.join(map(str, spec.trailing))})",
                    f"array of shape {arr.shape}",
                )
            this_lead = arr.shape[:nlead]
            if lead is None:
                lead = this_lead
            elif this_lead != lead:
                raise ObservationError(
                    spec.path, f"leading batch axes {lead} like the other columns", f"{this_lead}"
                )
            arrays[spec.key] = arr.reshape((-1, *spec.trailing)) if nlead != 1 else arr
        return arrays, lead if lead is not None else (0,)

    # ------------------------------------------------------------------ node protocol

    def _specs(self, key: str, path: str) -> list[LeafSpec]:
        raise NotImplementedError

    def _layout(self, key: str, offset: int) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _write(self, obs: Any, out: np.ndarray, path: str) -> None:
        raise NotImplementedError

    def _gather(self, rows: list[Any], key: str, path: str, label: Label) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def _write_columns(
        self, cols: Mapping[str, np.ndarray], key: str, out: np.ndarray, path: str, label: Label
    ) -> None:
        raise NotImplementedError
