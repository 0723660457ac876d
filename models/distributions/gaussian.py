"""DiagGaussian and SquashedGaussian (float Box actions).

DiagGaussian: ``mean, log_std = split(inputs, 2)``, ``std = exp(log_std)`` with **no**
clipping and no use of the Box bounds (RLlib ignores ``log_std_clip_param`` here);
logp and entropy are summed over the action dims.

SquashedGaussian (RLlib's SAC distribution): log_std clamped to [-5, 2]; samples are
``((tanh(u) + 1) / 2) * (high - low) + low`` clamped to [low, high]; ``logp`` unsquashes
with the normalised value clamped to +-(1 - 1e-6), clamps the Normal log-density to
[-100, 100] per dim and subtracts ``sum(log(1 - tanh(u)^2 + 1e-6))`` (the (high-low)/2
Jacobian is not included). ``low``/``high`` default to -1/1 and are not taken from the
space. Its entropy is undefined and raises :class:`UnsupportedMethodError`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from gymnasium import spaces as gs

from ..spaces import shape_of
from ._math import F32, as_f32, sum32
from ._math import SMALL_BLOCK as _PY_BLOCK
from .base import ActionDistribution, DistributionError, UnsupportedMethodError

__all__ = ["DiagGaussian", "SquashedGaussian"]

_LOG_SQRT_2PI_64 = math.log(math.sqrt(2 * math.pi))
_LOG_SQRT_2PI = F32(_LOG_SQRT_2PI_64)
_HALF_LOG_2PI_PLUS_HALF = F32(0.5 + 0.5 * math.log(2 * math.pi))
_SMALL_NUMBER = F32(1e-6)
_MIN_LOG_STD, _MAX_LOG_STD = F32(-5.0), F32(2.0)


def _split_mean_log_std(inputs: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    n = inputs.shape[1]
    if n % 2:
        raise ValueError(f"{name}: dist inputs need an even width (mean | log_std), got {n}")
    return inputs[:, : n // 2], inputs[:, n // 2 :]


def _normal_log_prob(value: np.ndarray, loc: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """torch Normal.log_prob, op for op in float32."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        var = (scale * scale).astype(F32)
        diff = (as_f32(value) - loc).astype(F32)
        out = (-(diff * diff).astype(F32) / (F32(2.0) * var)).astype(F32)
        return (out - np.log(scale).astype(F32) - _LOG_SQRT_2PI).astype(F32)


def _py_normal_logp(values: list[list[float]], means: list[list[float]],
                    stds: list[list[float]]) -> list[float] | None:
    """The Normal log-density summed per row, in float64 (``DiagGaussian._own_logp``'s
    arithmetic); None when a std is not a positive finite number or a value is NaN (``logp``
    handles, or refuses, those)."""
    out = []
    for value_row, mean_row, std_row in zip(values, means, stds, strict=True):
        total = 0.0
        for value, mean, std in zip(value_row, mean_row, std_row, strict=True):
            if not 0.0 < std < math.inf or value != value:  # a NaN std fails the first test
                return None
            diff = value - mean
            total += -(diff * diff) / (2.0 * (std * std)) - math.log(std) - _LOG_SQRT_2PI_64
        out.append(total)
    return out


def _check_actions(dist: ActionDistribution, actions: Any, width: int) -> np.ndarray:
    arr = as_f32(dist._check_batch(actions, "logp"))
    arr = arr.reshape(dist.batch_size, -1)
    if arr.shape[1] != width:
        raise ValueError(f"{type(dist).__name__}.logp: expected {width} action dims, got {arr.shape[1]}")
    if np.isnan(arr).any():
        raise DistributionError(f"{type(dist).__name__}.logp: actions contain NaN")
    return arr


class DiagGaussian(ActionDistribution):
    """``(B, 2D)`` inputs -> ``(B, D)`` float32 actions."""

    rllib_name = "TorchDiagGaussian"

    def __init__(self, inputs: np.ndarray, action_space: gs.Space | None = None):
        super().__init__(inputs)
        self.action_space = action_space  # carried like RLlib's partial; bounds are not used
        self.mean, log_std = _split_mean_log_std(self.inputs, "DiagGaussian")
        with np.errstate(over="ignore"):
            self.std = np.exp(log_std).astype(F32)

    @staticmethod
    def required_model_output_shape(action_space: gs.Space, model_config: dict[str, Any]) -> int:
        return int(np.prod(shape_of(action_space), dtype=np.int64)) * 2

    def _sample(self, rng: np.random.Generator) -> np.ndarray:
        eps = rng.standard_normal(self.mean.shape).astype(F32)
        return (self.mean + self.std * eps).astype(F32)

    def _mode(self) -> np.ndarray:
        return self.mean.copy()

    def logp(self, actions: Any) -> np.ndarray:
        x = _check_actions(self, actions, self.mean.shape[1])
        return sum32(_normal_log_prob(x, self.mean, self.std))

    def _own_logp(self, sample: np.ndarray) -> np.ndarray:
        """logp of this distribution's own sample or mode, without ``logp``'s checks: the
        Normal log-density in float64, summed left to right and rounded once to float32, with
        Python floats for a small block and numpy for a larger one (the same operations in
        the same order, so a row gets the same bits alone or batched; RLlib's float32 numbers
        to float32 rounding). NaN values and a std that is 0 or inf go to ``logp``."""
        x = sample.reshape(self.batch_size, -1)
        if x.size <= _PY_BLOCK:
            small = _py_normal_logp(x.tolist(), self.mean.tolist(), self.std.tolist())
            if small is not None:
                return np.array(small, dtype=F32)
        elif not np.isnan(x).any() and ((self.std > 0) & (self.std < np.inf)).all():
            diff = x.astype(np.float64) - self.mean
            std = self.std.astype(np.float64)
            per_dim = -(diff * diff) / (2.0 * (std * std)) - np.log(std) - _LOG_SQRT_2PI_64
            return np.add.accumulate(per_dim, axis=1)[:, -1].astype(F32)
        return self.logp(sample)

    def entropy(self) -> np.ndarray:
        with np.errstate(divide="ignore"):
            per_dim = (_HALF_LOG_2PI_PLUS_HALF + np.log(self.std)).astype(F32)
        return sum32(per_dim)


class SquashedGaussian(ActionDistribution):
    """tanh-squashed Gaussian on [low, high]: ``(B, 2D)`` inputs -> ``(B, D)`` actions."""

    rllib_name = "TorchSquashedGaussian"

    def __init__(self, inputs: np.ndarray, low: float = -1.0, high: float = 1.0):
        super().__init__(inputs)
        if not np.all(np.less(low, high)):
            raise ValueError(f"SquashedGaussian: need low < high, got low={low} high={high}")
        self.low, self.high = low, high
        self.mean, log_std = _split_mean_log_std(self.inputs, "SquashedGaussian")
        self.std = np.exp(np.clip(log_std, _MIN_LOG_STD, _MAX_LOG_STD)).astype(F32)

    @staticmethod
    def required_model_output_shape(action_space: gs.Space, model_config: dict[str, Any]) -> int:
        return int(np.prod(shape_of(action_space), dtype=np.int64)) * 2

    def _squash(self, raw: np.ndarray) -> np.ndarray:
        low, high = as_f32(self.low), as_f32(self.high)
        squashed = (((np.tanh(raw) + F32(1.0)) / F32(2.0)) * (high - low) + low).astype(F32)
        return np.clip(squashed, low, high).astype(F32)

    def _unsquash(self, values: np.ndarray) -> np.ndarray:
        low, high = as_f32(self.low), as_f32(self.high)
        normed = ((values - low) / (high - low) * F32(2.0) - F32(1.0)).astype(F32)
        safe = np.clip(normed, F32(-1.0 + 1e-6), F32(1.0 - 1e-6)).astype(F32)
        return np.arctanh(safe).astype(F32)

    def _sample(self, rng: np.random.Generator) -> np.ndarray:
        eps = rng.standard_normal(self.mean.shape).astype(F32)
        return self._squash((self.mean + self.std * eps).astype(F32))

    def _mode(self) -> np.ndarray:
        return self._squash(self.mean)

    def logp(self, actions: Any) -> np.ndarray:
        u = self._unsquash(_check_actions(self, actions, self.mean.shape[1]))
        gauss = np.clip(_normal_log_prob(u, self.mean, self.std), F32(-100.0), F32(100.0))
        gauss_sum = sum32(gauss)
        t = np.tanh(u).astype(F32)
        jac = np.log((F32(1.0) - t * t) + _SMALL_NUMBER).astype(F32)
        return (gauss_sum - np.sum(jac, axis=-1, dtype=F32)).astype(F32)

    def entropy(self) -> np.ndarray:
        raise UnsupportedMethodError("SquashedGaussian: entropy is not defined (RLlib raises too)")
