"""Comparing runtime outputs with expected ones, per output, with a clear verdict (torch-free)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlserve.models.export.errors import BundleError


def compare_outputs(
    actual: Mapping[str, Any], expected: Mapping[str, np.ndarray], rtol: float, atol: float, what: str
) -> dict[str, float]:
    """Elementwise ``|a - e| <= atol + rtol * |e|`` per output (NaN must match NaN)."""
    diffs: dict[str, float] = {}
    for name, exp in expected.items():
        if name not in actual:
            raise BundleError(f"{what}: runtime returned no output {name!r} (got {sorted(actual)})")
        act = np.asarray(actual[name])
        if act.shape != exp.shape:
            raise BundleError(f"{what}: output {name!r} has shape {act.shape}, reference {exp.shape}")
        diffs[name] = _check_close(name, act, exp, rtol, atol, what)
    return diffs


def _check_close(name: str, act: np.ndarray, exp: np.ndarray, rtol: float, atol: float, what: str) -> float:
    a, e = act.astype(np.float64), exp.astype(np.float64)
    nan_a, nan_e = np.isnan(a), np.isnan(e)
    if not np.array_equal(nan_a, nan_e):
        raise BundleError(f"{what}: output {name!r} has NaN where the reference has none (or vice versa)")
    with np.errstate(invalid="ignore", over="ignore"):
        # Equal infinities (and equal huge masked logits) differ by 0, not inf - inf.
        diff = np.where(a == e, 0.0, np.abs(a - e))
        diff = np.where(nan_a, 0.0, diff)
        bad = diff > atol + rtol * np.abs(np.where(nan_e, 0.0, e))
    max_diff = float(diff.max()) if diff.size else 0.0
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise BundleError(
            f"{what}: output {name!r} disagrees with the reference: max |diff| {max_diff:.3g}, "
            f"first at index {idx}: got {a[idx]!r}, expected {e[idx]!r} (rtol={rtol}, atol={atol})"
        )
    return max_diff if math.isfinite(max_diff) else float("inf")
