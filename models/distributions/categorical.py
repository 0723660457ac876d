"""Categorical and MultiCategorical (Discrete, MultiDiscrete and integer Box actions).

Mirrors torch's ``Categorical(logits=x)`` as RLlib wraps it: logits are normalised with
``x - logsumexp(x)``, probabilities are ``softmax`` of those, the mode is the argmax of
the probabilities (the first on ties), and the entropy clamps logits at the float32
minimum so a masked logit (-3.4e38) with probability 0 contributes 0, not nan.
Actions are category **indices** 0..n-1; for an integer Box they are indices
0..high-low, not values shifted by ``low`` (RLlib's behaviour).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from math import exp, log
from typing import Any, cast

import numpy as np
from gymnasium import spaces as gs

from ._math import F32, log_softmax32, softmax32, sum32
from ._math import SMALL_BLOCK as _PY_BLOCK
from .base import ActionDistribution, ActionOutOfSupportError, DistributionError

__all__ = ["Categorical", "MultiCategorical", "sample_index"]

_F32_MIN = np.finfo(np.float32).min
_max = np.maximum.reduce
_add = np.add.reduce
_accumulate = np.add.accumulate
# Logits whose row maxima stay below this in magnitude take the short path of ``_Cat``:
# ``x - max`` and ``x - logsumexp`` cannot overflow float32 there (a masked logit is
# -3.4e38), so no ``errstate`` is needed. Anything else (NaN, inf, huge) takes the
# general functions, which give the same numbers.
_SHORT_PATH_MAX = 1e30


def sample_index(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One index per row by inverse CDF; an index with probability 0 is never drawn."""
    cdf = _accumulate(probs, axis=1, dtype=np.float64)
    u = rng.random(cdf.shape[0]) * cdf[:, -1]
    idx = _add(cdf <= u[:, None], axis=1, dtype=np.int64)
    # The first index whose CDF exceeds u has mass (its CDF step is > 0). Only when u*total
    # rounds up to total is there none (idx == n): then take the last index with mass.
    if _max(idx) < cdf.shape[1]:
        return idx
    p = np.asarray(probs, dtype=np.float64)
    last_with_mass = p.shape[1] - 1 - np.argmax(p[:, ::-1] > 0, axis=1)
    return np.minimum(idx, last_with_mass).astype(np.int64)


def _sample_columns(probs_t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``sample_index`` on the (n, B) transpose of the probabilities: the same uniforms, the
    same float64 CDF (``_cumsum_columns``), the same rule."""
    n, rows = probs_t.shape
    cdf = _cumsum_columns(probs_t)
    u = rng.random(rows) * cdf[-1]
    idx = _add(cdf <= u, axis=0, dtype=np.int64)
    if _max(idx) < n:
        return idx
    last_with_mass = n - 1 - np.argmax(probs_t[::-1] > 0, axis=0)
    return np.minimum(idx, last_with_mass).astype(np.int64)


def _cumsum_columns(values_t: np.ndarray) -> np.ndarray:
    """The float64 running sums of a (n, B) block down its n rows, one whole row at a time:
    row k holds, for every column, values 0..k added left to right, the same additions in
    the same order as ``np.add.accumulate`` along a row of the (B, n) block, without numpy's
    inner loop over n values per row (~8x faster on 1024 rows of 4)."""
    out = np.empty(values_t.shape, np.float64)
    out[0] = values_t[0]
    for k in range(1, values_t.shape[0]):
        np.add(out[k - 1], values_t[k], out=out[k])
    return out


def _reject_nan(inputs: np.ndarray, name: str) -> None:
    bad = np.isnan(inputs).any(axis=1)
    if bad.any():
        raise DistributionError(f"{name}: dist inputs contain NaN in rows {np.flatnonzero(bad).tolist()}")


def _check_indices(actions: np.ndarray, n: int, where: str) -> np.ndarray:
    """Integer-valued indices in [0, n), else ActionOutOfSupportError (torch validates too)."""
    arr = np.asarray(actions)
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.floor(arr)):
            raise ActionOutOfSupportError(f"{where}: actions must be integer indices, got {arr.tolist()}")
    elif arr.dtype.kind not in "iub":
        raise ActionOutOfSupportError(f"{where}: actions must be integer indices, got dtype {arr.dtype}")
    bad = (arr < 0) | (arr >= n)
    if np.any(bad):
        raise ActionOutOfSupportError(
            f"{where}: actions must be category indices in [0, {n - 1}], got {arr[bad].tolist()} "
            f"(for an integer Box the index is value - low)"
        )
    return arr.astype(np.int64)


def _py_rows(x: np.ndarray) -> tuple[list[list[float]], list[list[float]]] | None:
    """``_Cat``'s float64 arithmetic with Python floats, row by row: the normalised logits
    (float64, rounded when an array or a logp is built from them) and the probabilities
    (rounded to float32). None when a row holds NaN or a logit beyond the short path's range
    (the numpy functions then refuse or handle it)."""
    logits, probs = [], []
    for row in x.tolist():
        m = max(row)
        if not abs(m) < _SHORT_PATH_MAX:  # False for NaN as well
            return None
        e = [exp(v - m) for v in row]
        s = 0.0
        for v in e:  # left to right, as np.add.accumulate
            s += v
        if s != s:  # a NaN that max() stepped over
            return None
        lse = log(s) + m
        logits.append([v - lse for v in row])
        probs.append(array("f", [v / s for v in e]).tolist())
    return logits, probs


def _draw(p: list[float], u: float) -> int:
    """``sample_index``'s rule on one row of Python-float probabilities with its uniform
    ``u``: the first index whose float64 CDF exceeds ``u * total``, else the last index
    with mass."""
    total = 0.0
    for v in p:
        total += v
    target, cdf = u * total, 0.0
    for i, v in enumerate(p):
        cdf += v
        if cdf > target:
            return i
    return max(i for i, v in enumerate(p) if v > 0)


class _Cat:
    """One categorical over the last axis of a (B, n) logits block.

    Built once per served batch. Ordinary logits (every row's max below 1e30 in magnitude)
    are normalised in float64: ``m = max``, ``e = exp(x - m)``, ``s`` = the left-to-right sum
    of ``e``, logits ``x - (log(s) + m)`` and probabilities ``e / s``, each rounded once to
    float32 (RLlib's float32 kernels give the same numbers to float32 rounding). A block of
    at most ``_PY_BLOCK`` logits does that arithmetic with Python floats, a larger one with
    numpy: the same IEEE operations in the same order, so a row gets the same bits whatever
    batch it shares (exp and log are the C library's in both wherever numpy uses it for
    float64; where numpy has its own SIMD float64 exp/log, a last-bit difference survives
    the rounding to float32 about once in 10^9 values). Anything else (NaN, inf, huge) takes
    the float32 functions of ``_math``, which refuse NaN rows. The numpy path of a block with
    at least as many rows as categories computes on the block's transpose: the same values.
    """

    def __init__(self, raw_logits: np.ndarray, name: str):
        x = np.asarray(raw_logits, dtype=F32)
        self.n = int(x.shape[1])
        self._rows = _py_rows(x) if x.size <= _PY_BLOCK else None
        self._logits: np.ndarray | None = None
        self._probs: np.ndarray | None = None
        # A block of at least as many rows as categories (a served batch) works on its
        # (n, B) transpose, one contiguous row per category: numpy's reductions along a
        # row of a few values cost more than the arithmetic. A wide one keeps (B, n).
        self._logits_t: np.ndarray | None = None
        self._probs_t: np.ndarray | None = None
        if self._rows is not None:
            return
        columns = self.n <= x.shape[0]
        # float64 logits: (n, B) on the transposed path, else (B, n); m, s: one per row of x.
        x64 = np.ascontiguousarray(x.T, dtype=np.float64) if columns else x.astype(np.float64)
        m = _max(x64, axis=0) if columns else _max(x64, axis=1, keepdims=True)
        if _max(np.abs(m), axis=None) < _SHORT_PATH_MAX:  # False for NaN as well
            e = np.exp(x64 - m)
            s = _cumsum_columns(e)[-1] if columns else _accumulate(e, axis=1)[:, -1:]
            logits = (x64 - (np.log(s) + m)).astype(F32)
            probs = (e / s).astype(F32)
            if columns:
                self._logits_t, self._probs_t = logits, probs
            else:
                self._logits, self._probs = logits, probs
        else:
            _reject_nan(x, name)
            self._logits = log_softmax32(x)
            self._probs = softmax32(self._logits)

    @property
    def logits(self) -> np.ndarray:
        if self._logits is None:
            self._logits = self._array(0)
        return self._logits

    @property
    def probs(self) -> np.ndarray:
        if self._probs is None:
            self._probs = self._array(1)
        return self._probs

    def _array(self, which: int) -> np.ndarray:
        """The logits (0) or probabilities (1) of the Python or the transposed path as a
        (B, n) float32 array."""
        if self._rows is None:
            t = self._logits_t if which == 0 else self._probs_t
            assert t is not None
            return np.ascontiguousarray(t.T)
        rows = self._rows[which]
        return np.array(rows, dtype=F32).reshape(len(rows), self.n)

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        if self._probs_t is not None:
            return _sample_columns(self._probs_t, rng)
        if self._rows is None:
            return sample_index(self.probs, rng)
        probs = self._rows[1]
        return np.array([_draw(p, u) for p, u in zip(probs, rng.random(len(probs)).tolist(), strict=True)],
                        dtype=np.int64)

    def mode(self) -> np.ndarray:
        if self._probs_t is not None:
            return np.argmax(self._probs_t, axis=0).astype(np.int64, copy=False)
        if self._rows is None:
            return np.argmax(self.probs, axis=1).astype(np.int64, copy=False)
        return np.array([p.index(max(p)) for p in self._rows[1]], dtype=np.int64)

    def logp(self, idx: np.ndarray, where: str) -> np.ndarray:
        idx = _check_indices(idx, self.n, where)
        return self.own_logp(idx)

    def own_logp(self, idx: np.ndarray) -> np.ndarray:
        """logp of indices this categorical drew itself: valid by construction."""
        if self._logits_t is not None:
            return self._logits_t[idx, np.arange(idx.shape[0])]
        if self._rows is None:
            return self.logits[np.arange(idx.shape[0]), idx]
        return np.array([row[i] for row, i in zip(self._rows[0], idx.tolist(), strict=True)], dtype=F32)

    def entropy(self) -> np.ndarray:
        p_log_p = (np.maximum(self.logits, _F32_MIN) * self.probs).astype(F32)
        return -sum32(p_log_p)


class Categorical(ActionDistribution):
    """Discrete(n) actions: ``(B, n)`` logits -> ``(B,)`` int64 indices."""

    rllib_name = "TorchCategorical"

    def __init__(self, inputs: np.ndarray, temperature: float = 1.0):
        super().__init__(inputs)
        if temperature != 1.0:
            if not temperature > 0.0:
                raise ValueError(f"Categorical temperature must be > 0, got {temperature}")
            self.inputs = (self.inputs / F32(temperature)).astype(F32)
        self._cat = _Cat(self.inputs, "Categorical")

    @staticmethod
    def required_model_output_shape(action_space: gs.Space, model_config: dict[str, Any]) -> int:
        return int(cast(gs.Discrete, action_space).n)  # the catalog pairs Categorical with Discrete

    @property
    def probs(self) -> np.ndarray:
        return self._cat.probs

    def logp_each_action(self) -> np.ndarray:
        """(B, n) logp of every index (the normalised logits)."""
        return self._cat.logits

    def _sample(self, rng: np.random.Generator) -> np.ndarray:
        return self._cat.sample(rng)

    def sample_rows(self, rows: Sequence[int], rngs: Sequence[np.random.Generator]) -> np.ndarray | None:
        """Row ``rows[i]`` drawn with its own generator ``rngs[i]``, exactly as a one-row
        Categorical of that row draws it (a seeded session's sample, whatever batch the row
        shares): the same Python-float arithmetic on the same float32 logits, one uniform a
        row. None when a row needs the general functions (NaN or huge logits): the caller
        then builds each row's own distribution."""
        found = self._cat._rows
        if found is None:
            found = _py_rows(self.inputs[list(rows)])
            if found is None:
                return None
            probs = found[1]
        else:
            probs = [found[1][row] for row in rows]
        return np.array([_draw(p, rng.random()) for p, rng in zip(probs, rngs, strict=True)], dtype=np.int64)

    def _mode(self) -> np.ndarray:
        return self._cat.mode()

    def _own_logp(self, sample: np.ndarray) -> np.ndarray:
        return self._cat.own_logp(sample)

    def logp(self, actions: Any) -> np.ndarray:
        arr = self._check_batch(actions, "logp")
        if arr.ndim == 2 and arr.shape[1] == 1:  # a flat (B, 1) action column
            arr = arr[:, 0]
        if arr.ndim != 1:
            raise ValueError(f"Categorical.logp: expected actions of shape (B,), got {arr.shape}")
        return self._cat.logp(arr, "Categorical.logp")

    def entropy(self) -> np.ndarray:
        return self._cat.entropy()


class MultiCategorical(ActionDistribution):
    """MultiDiscrete or integer-Box actions: one categorical per ``input_lens`` block.

    Samples are ``(B, k)`` int64; with an integer Box ``action_space`` they are reshaped
    to ``(B, *shape)`` and ``logp`` accepts that shape.
    """

    rllib_name = "TorchMultiCategorical"

    def __init__(self, inputs: np.ndarray, input_lens: Sequence[int], action_space: gs.Space | None = None):
        super().__init__(inputs)
        self.input_lens = [int(n) for n in input_lens]
        if sum(self.input_lens) != self.inputs.shape[1]:
            raise ValueError(
                f"MultiCategorical: input_lens {self.input_lens} sum to {sum(self.input_lens)}, "
                f"but the dist inputs have {self.inputs.shape[1]} columns"
            )
        self.action_space = action_space
        bounds = np.cumsum(self.input_lens)[:-1]
        self.cats = [_Cat(block, "MultiCategorical") for block in np.split(self.inputs, bounds, axis=1)]

    @staticmethod
    def required_model_output_shape(action_space: gs.Space, model_config: dict[str, Any]) -> int:
        if isinstance(action_space, gs.Box):
            span = int(np.max(action_space.high)) - int(np.min(action_space.low)) + 1
            return int(np.prod(action_space.shape)) * span
        return int(np.sum(cast(gs.MultiDiscrete, action_space).nvec))

    def _shape(self, stacked: np.ndarray) -> np.ndarray:
        if isinstance(self.action_space, gs.Box):
            return stacked.reshape((-1, *self.action_space.shape))
        return stacked

    def _sample(self, rng: np.random.Generator) -> np.ndarray:
        return self._shape(np.stack([c.sample(rng) for c in self.cats], axis=1))

    def _mode(self) -> np.ndarray:
        return self._shape(np.stack([c.mode() for c in self.cats], axis=1))

    def _own_logp(self, sample: np.ndarray) -> np.ndarray:
        cols = sample.reshape(self.batch_size, -1)
        total = np.zeros(self.batch_size, dtype=F32)
        for i, cat in enumerate(self.cats):
            total = total + cat.own_logp(cols[:, i])
        return total

    def _components(self, actions: Any) -> list[np.ndarray]:
        if isinstance(actions, list | tuple):  # RLlib also takes one array per component
            comps = [np.asarray(a) for a in actions]
        else:
            arr = self._check_batch(actions, "logp").reshape(self.batch_size, -1)
            comps = [arr[:, i] for i in range(arr.shape[1])]
        if len(comps) != len(self.cats):
            raise ValueError(
                f"MultiCategorical.logp: expected {len(self.cats)} action components, got {len(comps)}"
            )
        return comps

    def logp(self, actions: Any) -> np.ndarray:
        total = np.zeros(self.batch_size, dtype=F32)
        for i, (cat, comp) in enumerate(zip(self.cats, self._components(actions), strict=True)):
            total = (total + cat.logp(comp, f"MultiCategorical.logp component {i}")).astype(F32)
        return total

    def multi_entropy(self) -> np.ndarray:
        return np.stack([c.entropy() for c in self.cats], axis=1)

    def entropy(self) -> np.ndarray:
        return sum32(self.multi_entropy(), axis=1)
