"""Comparing runtime outputs with expected ones, per output, with a clear verdict (torch-free).

The rule, per output tensor ``e`` (the eager reference) and ``a`` (a runtime's answer)::

    |a - e| <= atol + rtol * |e| + max_rtol * max|e|

The last term is float32 rounding: two correct kernels (eager torch, ONNX Runtime, another
CPU's SIMD path) sum the same products in different orders, so they differ by a few units
of float32's roundoff (2**-24) *of the magnitudes that were summed*, not of the result. An
element that cancels to 0.1 inside a tensor of logits of order 100 carries the rounding of
the order-100 terms; ``max|e|`` over the tensor stands for that magnitude (the check sees
only outputs). ``MAX_RTOL`` is 512 roundoffs; docs/export.md gives the measurements behind
it and shows that a wrong weight, transposed matrix or missing bias still fails.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlserve.models.export.errors import BundleError

# float32 unit roundoff: the largest relative error of one rounding.
UNIT_ROUNDOFF = 2.0**-24
# Tolerance relative to the largest |expected| value of an output: 512 roundoffs (about
# 3.1e-5). Correct runtimes were measured at up to ~50 roundoffs of that magnitude.
MAX_RTOL = 512 * UNIT_ROUNDOFF
# |expected| at or above this is a sentinel, not a magnitude of the computation: RLlib's
# action masking adds FLOAT_MIN (-3.4e38) to masked logits. Such elements are still
# compared elementwise; they are left out of max|e| so they do not widen the tolerance.
SENTINEL = 1e30
RULE = "|a - e| <= atol + rtol*|e| + max_rtol*max|e| per output (max over finite |e| < 1e30)"


def output_scale(expected: np.ndarray) -> float:
    """The magnitude the tolerance scales with: max |e| over finite, non-sentinel elements."""
    mags = np.abs(np.asarray(expected, dtype=np.float64)).ravel()
    mags = mags[np.isfinite(mags) & (mags < SENTINEL)]
    return float(mags.max()) if mags.size else 0.0


def compare_outputs(
    actual: Mapping[str, Any], expected: Mapping[str, np.ndarray], rtol: float, atol: float, what: str,
    max_rtol: float = MAX_RTOL,
) -> dict[str, float]:
    """Elementwise ``|a - e| <= atol + rtol * |e| + max_rtol * max|e|`` per output (NaN must match NaN)."""
    diffs: dict[str, float] = {}
    for name, exp in expected.items():
        if name not in actual:
            raise BundleError(f"{what}: runtime returned no output {name!r} (got {sorted(actual)})")
        act = np.asarray(actual[name])
        if act.shape != exp.shape:
            raise BundleError(f"{what}: output {name!r} has shape {act.shape}, reference {exp.shape}")
        diffs[name] = _check_close(name, act, exp, rtol, atol, max_rtol, what)
    return diffs


def _check_close(
    name: str, act: np.ndarray, exp: np.ndarray, rtol: float, atol: float, max_rtol: float, what: str
) -> float:
    a, e = act.astype(np.float64), exp.astype(np.float64)
    nan_a, nan_e = np.isnan(a), np.isnan(e)
    if not np.array_equal(nan_a, nan_e):
        raise BundleError(f"{what}: output {name!r} has NaN where the reference has none (or vice versa)")
    scale = output_scale(e)
    with np.errstate(invalid="ignore", over="ignore"):
        # Equal infinities (and equal huge masked logits) differ by 0, not inf - inf.
        diff = np.where(a == e, 0.0, np.abs(a - e))
        diff = np.where(nan_a, 0.0, diff)
        allowed = atol + max_rtol * scale + rtol * np.abs(np.where(nan_e, 0.0, e))
        bad = diff > allowed
    max_diff = float(diff.max()) if diff.size else 0.0
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise BundleError(
            f"{what}: output {name!r} disagrees with the reference: max |diff| {max_diff:.3g}, "
            f"first at index {idx}: got {float(a[idx])!r}, expected {float(e[idx])!r}, "
            f"allowed {float(allowed[idx]):.3g} "
            f"(rtol={rtol}, atol={atol}, max_rtol={max_rtol:.3g} of max |expected| {scale:.3g})"
        )
    return max_diff if math.isfinite(max_diff) else float("inf")
