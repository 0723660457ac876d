"""Numerics shared by the distributions: float32 where torch computes in float32.

RLlib's numbers come from torch float32 kernels. To match them to ~1e-6 relative we
do the same operations in the same order in float32; special functions (lgamma,
digamma) are evaluated in float64 and rounded once to float32, which is what a
correctly rounded float32 kernel returns.
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np
import numpy.typing as npt

F32 = np.float32
# Blocks of at most this many values (one environment's step, a few rows) take Python
# floats in the served distribution step (categorical sampling, the Gaussian's logp of
# its sample): on so small an array a dozen numpy calls cost more than the arithmetic, and
# several times more when a lone request runs with cold caches.
SMALL_BLOCK = 32
_LGAMMA = np.frompyfunc(math.lgamma, 1, 1)


def as_f32(x: npt.ArrayLike) -> np.ndarray:
    return np.asarray(x, dtype=F32)


def sum32(x: npt.ArrayLike, axis: int = -1) -> np.ndarray:
    """Sum over ``axis`` accumulated in float32, as torch's float32 kernels do.

    Callers pass batched (ndim >= 2) arrays, so the result is an array; numpy's stubs
    type a reduction as "scalar or array", hence the cast.
    """
    return cast(np.ndarray, np.sum(x, axis=axis, dtype=F32).astype(F32))


# The ufuncs' own reduce methods give the same results as np.max / np.sum and skip their
# Python dispatch layer (~1-2 us a call); these run once per served batch.
_max = np.maximum.reduce
_add = np.add.reduce


def logsumexp32(x: np.ndarray) -> np.ndarray:
    """``log(sum(exp(x - max))) + max`` over the last axis, keepdims; float32.

    A row whose max is +-inf uses 0 as the shift (torch does the same), so a row of
    -inf gives -inf rather than nan.
    """
    x = as_f32(x)
    m = _max(x, axis=-1, keepdims=True)
    finite = np.isfinite(m)
    if not finite.all():
        m = np.where(finite, m, F32(0.0)).astype(F32)
    with np.errstate(over="ignore", under="ignore", divide="ignore"):
        s = _add(np.exp(x - m), axis=-1, keepdims=True, dtype=F32)
        return (np.log(s) + m).astype(F32, copy=False)


def log_softmax32(x: np.ndarray) -> np.ndarray:
    """Normalised logits ``x - logsumexp(x)`` (torch Categorical's ``logits``)."""
    x = as_f32(x)
    return (x - logsumexp32(x)).astype(F32, copy=False)


def softmax32(x: np.ndarray) -> np.ndarray:
    """``exp(x - max) / sum`` over the last axis in float32 (torch's softmax kernel)."""
    x = as_f32(x)
    m = _max(x, axis=-1, keepdims=True)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        e = np.exp(x - m).astype(F32, copy=False)
        return (e / _add(e, axis=-1, keepdims=True, dtype=F32)).astype(F32, copy=False)


def lgamma(x: np.ndarray) -> np.ndarray:
    """log|Gamma(x)| in float64 (elementwise; +inf at the poles)."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    flat_in, flat_out = x.ravel(), out.ravel()
    poles = (flat_in <= 0) & (flat_in == np.floor(flat_in))
    good = np.isfinite(flat_in) & ~poles
    flat_out[good] = _LGAMMA(flat_in[good]).astype(np.float64)
    flat_out[poles | np.isinf(flat_in)] = np.inf
    flat_out[np.isnan(flat_in)] = np.nan
    return flat_out.reshape(x.shape)


def digamma(x: np.ndarray) -> np.ndarray:
    """The digamma function psi(x) in float64 (recurrence, then the asymptotic series)."""
    x = np.asarray(x, dtype=np.float64)
    reflect = x < 0.5
    with np.errstate(divide="ignore", invalid="ignore"):
        # psi(x) = psi(1 - x) - pi / tan(pi x) for small or negative x.
        z = np.where(reflect, 1.0 - x, x)
        acc = np.zeros_like(z)
        for _ in range(8):  # shift z above 8 where the series converges to double precision
            small = z < 8.0
            acc = acc - np.where(small, 1.0 / z, 0.0)
            z = np.where(small, z + 1.0, z)
        inv = 1.0 / z
        inv2 = inv * inv
        series = inv2 * (
            1.0 / 12 - inv2 * (1.0 / 120 - inv2 * (1.0 / 252 - inv2 * (1.0 / 240 - inv2 * (1.0 / 132))))
        )
        psi = np.log(z) - 0.5 * inv - series + acc
        out = np.where(reflect, psi - np.pi / np.tan(np.pi * x), psi)
    out = np.where((x <= 0) & (x == np.floor(x)), np.nan, out)
    return out


def lgamma32(x: npt.ArrayLike) -> np.ndarray:
    return lgamma(as_f32(x)).astype(F32)


# Coefficients of the asymptotic series psi(x) ~ log x - 1/(2x) - z * P(z), z = 1/x^2
# (Cephes), evaluated by Horner's rule from the first.
_PSI_SERIES = np.array(
    [8.33333333333333333333e-2, -2.10927960927960927961e-2, 7.57575757575757575758e-3,
     -4.16666666666666666667e-3, 3.96825396825396825397e-3, -8.33333333333333333333e-3,
     8.33333333333333333333e-2],
    dtype=F32,
)
_PSI_10 = F32(2.25175258906672110764)


def digamma32(x: npt.ArrayLike) -> np.ndarray:
    """psi(x) the way torch's float32 CPU kernel computes it (Cephes, all in float32).

    A float64 psi rounded to float32 differs from torch in the last bits for most
    inputs; Dirichlet/Beta entropies multiply psi by ~1e7 and cancel, so we follow the
    float32 recipe: shift x to >= 10 accumulating -1/x, then the asymptotic series.
    Negative x uses the reflection formula (not needed by the distributions).
    """
    x = as_f32(x)
    positive = x > 0
    z = np.where(positive, x, F32(1.0)).astype(F32)
    acc = np.zeros_like(z)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        while np.any(z < 10):
            small = z < 10
            acc = np.where(small, (acc - F32(1.0) / z).astype(F32), acc)
            z = np.where(small, (z + F32(1.0)).astype(F32), z)
        inv2 = (F32(1.0) / (z * z)).astype(F32)
        poly = np.full_like(z, _PSI_SERIES[0])
        for coef in _PSI_SERIES[1:]:
            poly = (poly * inv2 + coef).astype(F32)
        tail = (inv2 * poly).astype(F32)
        series = (((acc + np.log(z).astype(F32)).astype(F32) - (F32(0.5) / z)).astype(F32) - tail).astype(F32)
        out = np.where(z == 10, (acc + _PSI_10).astype(F32), series)
        other = digamma(x.astype(np.float64)).astype(F32)  # x <= 0: poles and reflection
        other = np.where(x == 0, F32(-np.inf), other)
    return np.where(positive, out, other).astype(F32)


def xlogy32(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``x * log(y)`` with 0 where x == 0 (torch.xlogy), float32."""
    x, y = as_f32(x), as_f32(y)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (x * np.log(y)).astype(F32)
    return np.where(x == 0, F32(0.0), out).astype(F32)
