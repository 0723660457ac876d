"""Observation filters with RLlib's arithmetic: ``MeanStdFilter`` and ``NoFilter``.

In RLlib's old API stack the filter runs on the *preprocessed* (flat) observation. A
serving bundle carries the trained filter's statistics and applies it frozen
(``update=False``); updating is kept for parity and tests.

RLlib's running statistics (``ray.rllib.utils.filter.RunningStat``), reproduced exactly:

- Welford per pushed observation, in float64: the first push sets the mean; later ones do
  ``delta = x - mean; mean += delta / n; S += delta * (x - mean)`` (new mean);
- ``var = S / (n - 1)`` cast to float32 (0 while ``n <= 1``), ``std = sqrt(var)`` in float32;
- ``out = clip((x - mean) / (std + 1e-6), -clip, clip)`` computed in float64 and cast back
  to the input's dtype.

A batch with ``update=True`` crashes inside RLlib 2.60 (``range(x.shape)``); here it is what
RLlib's code means: the rows are pushed one after another (the statistics equal pushing
them one at a time), then the whole batch is normalised with the final statistics.

State round-trips through plain JSON (``state_dict``/``from_state``: lists, exact floats)
and through npz arrays (``to_arrays``/``from_arrays``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["SMALL_NUMBER", "MeanStdFilter", "NoFilter", "filter_from_state", "make_filter"]

SMALL_NUMBER = 1e-6  # RLlib's guard against dividing by a zero std


def _shape(value: Any, what: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in value)
    except TypeError:
        raise ValueError(f"{what}: expected a list of non-negative integers, got {value!r}") from None
    if any(d < 0 for d in shape):
        raise ValueError(f"{what}: expected non-negative dimensions, got {list(shape)}")
    return shape


class MeanStdFilter:
    """Running mean/std normalisation of observations of ``shape``; see the module docstring."""

    kind = "MeanStdFilter"

    def __init__(self, shape: Sequence[int], demean: bool = True, destd: bool = True, clip: float | None = 10.0):
        self.shape = _shape(shape, "MeanStdFilter shape")
        self.demean = bool(demean)
        self.destd = bool(destd)
        self.clip = None if clip is None else float(clip)
        self.num_pushes = 0
        self.mean_array = np.zeros(self.shape, dtype=np.float64)
        self.sum_sq_diff_array = np.zeros(self.shape, dtype=np.float64)

    # ------------------------------------------------------------------ statistics

    @property
    def mean(self) -> np.ndarray:
        return self.mean_array

    @property
    def var(self) -> np.ndarray:
        """Unbiased variance, float32; zeros until two observations were pushed."""
        if self.num_pushes <= 1:
            return np.zeros(self.shape, dtype=np.float32)
        return (self.sum_sq_diff_array / (self.num_pushes - 1)).astype(np.float32)

    @property
    def std(self) -> np.ndarray:
        return np.sqrt(self.var)

    def push(self, x: Any) -> None:
        """Add one observation of ``shape`` to the running statistics."""
        x = np.asarray(x)
        if x.shape != self.shape:
            raise ValueError(f"MeanStdFilter.push: expected shape {self.shape}, got {x.shape}")
        self.num_pushes += 1
        if self.num_pushes == 1:
            self.mean_array[...] = x
            return
        n = self.num_pushes
        delta = x - self.mean_array
        self.mean_array[...] += delta / n
        # Welford's form with the *updated* mean; equal in exact arithmetic to
        # delta**2 * (n-1)/n, but this is the rounding RLlib's numbers carry.
        self.sum_sq_diff_array[...] += delta * (x - self.mean_array)

    # ------------------------------------------------------------------ filtering

    def __call__(self, x: Any, update: bool = True) -> np.ndarray:
        """Normalise one observation ``shape`` or a batch ``(B, *shape)``.

        ``update=True`` first pushes the observation (each row of a batch, in order).
        """
        x = np.asarray(x)
        batched = self._check_input(x)
        if update:
            for row in x if batched else (x,):
                self.push(row)
        return self.apply(x)

    def apply(self, x: Any) -> np.ndarray:
        """Normalise with the current statistics, without updating them."""
        x = np.asarray(x)
        self._check_input(x)
        out_dtype = x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)
        y = x.astype(np.float64) if x.dtype.kind != "f" else x
        if self.demean:
            y = y - self.mean_array
        if self.destd:
            y = y / (self.std + SMALL_NUMBER)  # the sum is float32, as in RLlib
        if self.clip is not None:
            y = np.clip(y, -self.clip, self.clip)
        return np.asarray(y).astype(out_dtype, copy=False)

    def _check_input(self, x: np.ndarray) -> bool:
        """True for a batch ``(B, *shape)``, False for one observation ``shape``."""
        if x.shape == self.shape:
            return False
        if x.ndim == len(self.shape) + 1 and x.shape[1:] == self.shape:
            return True
        raise ValueError(
            f"MeanStdFilter: expected an observation of shape {self.shape} or a batch "
            f"(B, {', '.join(map(str, self.shape))}), got shape {x.shape}"
        )

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON-able state; ``from_state`` restores it exactly."""
        return {
            "type": self.kind,
            "shape": list(self.shape),
            "demean": self.demean,
            "destd": self.destd,
            "clip": self.clip,
            "num_pushes": self.num_pushes,
            "mean": self.mean_array.tolist(),
            "sum_sq_diff": self.sum_sq_diff_array.tolist(),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> MeanStdFilter:
        if state.get("type", cls.kind) != cls.kind:
            raise ValueError(f"filter state: expected type {cls.kind!r}, got {state.get('type')!r}")
        for key in ("shape", "num_pushes", "mean", "sum_sq_diff"):
            if key not in state:
                raise ValueError(f"filter state: missing key {key!r} (got keys {sorted(state)})")
        filt = cls(state["shape"], state.get("demean", True), state.get("destd", True), state.get("clip", 10.0))
        filt._load(state["num_pushes"], state["mean"], state["sum_sq_diff"])
        return filt

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The state as numpy arrays (for ``np.savez``); ``from_arrays`` restores it."""
        return {
            "shape": np.asarray(self.shape, dtype=np.int64),
            "flags": np.asarray([self.demean, self.destd], dtype=bool),
            "clip": np.asarray(np.nan if self.clip is None else self.clip, dtype=np.float64),
            "num_pushes": np.asarray(self.num_pushes, dtype=np.int64),
            "mean_array": self.mean_array.copy(),
            "sum_sq_diff_array": self.sum_sq_diff_array.copy(),
        }

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> MeanStdFilter:
        for key in ("shape", "num_pushes", "mean_array", "sum_sq_diff_array"):
            if key not in arrays:
                raise ValueError(f"filter arrays: missing {key!r} (got {sorted(arrays)})")
        flags = np.asarray(arrays.get("flags", [True, True]), dtype=bool)
        clip = float(np.asarray(arrays.get("clip", 10.0)))
        filt = cls(
            np.asarray(arrays["shape"]).tolist(), bool(flags[0]), bool(flags[1]), None if math.isnan(clip) else clip
        )
        filt._load(int(np.asarray(arrays["num_pushes"])), arrays["mean_array"], arrays["sum_sq_diff_array"])
        return filt

    def _load(self, num_pushes: Any, mean: Any, sum_sq_diff: Any) -> None:
        if isinstance(num_pushes, bool) or int(num_pushes) != num_pushes or num_pushes < 0:
            raise ValueError(f"filter state 'num_pushes': expected an integer >= 0, got {num_pushes!r}")
        mean = np.asarray(mean, dtype=np.float64)
        sum_sq_diff = np.asarray(sum_sq_diff, dtype=np.float64)
        for name, arr in (("mean", mean), ("sum_sq_diff", sum_sq_diff)):
            if arr.shape != self.shape:
                raise ValueError(f"filter state {name!r}: expected shape {self.shape}, got {arr.shape}")
        self.num_pushes = int(num_pushes)
        self.mean_array[...] = mean
        self.sum_sq_diff_array[...] = sum_sq_diff

    def __repr__(self) -> str:
        return (f"MeanStdFilter(shape={self.shape}, n={self.num_pushes}, demean={self.demean}, "
                f"destd={self.destd}, clip={self.clip})")


class NoFilter:
    """The identity filter (RLlib's default ``observation_filter``)."""

    kind = "NoFilter"

    def __call__(self, x: Any, update: bool = True) -> np.ndarray:
        return np.asarray(x)

    def apply(self, x: Any) -> np.ndarray:
        return np.asarray(x)

    def state_dict(self) -> dict[str, Any]:
        return {"type": self.kind}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> NoFilter:
        if state.get("type", cls.kind) != cls.kind:
            raise ValueError(f"filter state: expected type {cls.kind!r}, got {state.get('type')!r}")
        return cls()

    def __repr__(self) -> str:
        return "NoFilter()"


_FILTERS = {"MeanStdFilter": MeanStdFilter, "ConcurrentMeanStdFilter": MeanStdFilter, "NoFilter": NoFilter}


def make_filter(name: str, shape: Sequence[int]) -> MeanStdFilter | NoFilter:
    """RLlib's ``observation_filter`` setting -> a fresh filter for observations of ``shape``."""
    if name not in _FILTERS:
        raise ValueError(f"observation_filter: expected one of {sorted(_FILTERS)}, got {name!r}")
    return NoFilter() if name == "NoFilter" else MeanStdFilter(shape)


def filter_from_state(state: Mapping[str, Any]) -> MeanStdFilter | NoFilter:
    """Rebuild a filter from ``state_dict()`` output, dispatching on its ``type``."""
    kind = state.get("type")
    if kind not in ("MeanStdFilter", "NoFilter"):
        raise ValueError(f"filter state 'type': expected 'MeanStdFilter' or 'NoFilter', got {kind!r}")
    return MeanStdFilter.from_state(state) if kind == "MeanStdFilter" else NoFilter.from_state(state)
