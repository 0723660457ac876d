"""Beta (float Box actions on [low, high], chosen explicitly as in RLlib).

RLlib: inputs clamped to [log 1e-6, -log 1e-6], then ``log(exp(x) + 1) + 1``; alpha is the
first half, beta the second. The mode is ``mean * (high - low) + low``; ``logp`` is
``sum(Beta.log_prob((x - low) / (high - low)))`` without a Jacobian; the entropy is **per
dimension** ``(B, D)``, not summed. low/high default to 0/1 and are not taken from the
space. Actions outside [low, high] raise :class:`ActionOutOfSupportError` (torch does too).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from gymnasium import spaces as gs

from ..spaces import shape_of
from ._math import F32, as_f32, sum32
from .base import ActionDistribution, ActionOutOfSupportError
from .dirichlet import dirichlet_entropy, dirichlet_log_prob

__all__ = ["Beta"]

_CLAMP = F32(math.log(1e-6))


class Beta(ActionDistribution):
    """``(B, 2D)`` inputs -> ``(B, D)`` actions in [low, high]."""

    rllib_name = "TorchBeta"

    def __init__(self, inputs: np.ndarray, low: float = 0.0, high: float = 1.0):
        super().__init__(inputs)
        n = self.inputs.shape[1]
        if n % 2:
            raise ValueError(f"Beta: dist inputs need an even width (alpha | beta), got {n}")
        self.low, self.high = low, high
        x = np.clip(self.inputs, _CLAMP, -_CLAMP).astype(F32)
        params = (np.log((np.exp(x) + F32(1.0)).astype(F32)) + F32(1.0)).astype(F32)
        self.alpha, self.beta = params[:, : n // 2], params[:, n // 2 :]
        self._conc = np.stack([self.alpha, self.beta], axis=-1)

    @staticmethod
    def required_model_output_shape(action_space: gs.Space, model_config: dict[str, Any]) -> int:
        return int(np.prod(shape_of(action_space), dtype=np.int64)) * 2

    def _squash(self, unit: np.ndarray) -> np.ndarray:
        low, high = as_f32(self.low), as_f32(self.high)
        return (unit * (high - low) + low).astype(F32)

    def _sample(self, rng: np.random.Generator) -> np.ndarray:
        draw = rng.beta(self.alpha.astype(np.float64), self.beta.astype(np.float64))
        return self._squash(draw.astype(F32))

    def _mode(self) -> np.ndarray:
        return self._squash((self.alpha / (self.alpha + self.beta)).astype(F32))

    def logp(self, actions: Any) -> np.ndarray:
        x = as_f32(self._check_batch(actions, "logp")).reshape(self.batch_size, -1)
        if x.shape != self.alpha.shape:
            raise ValueError(f"Beta.logp: expected actions of shape {self.alpha.shape}, got {x.shape}")
        low, high = as_f32(self.low), as_f32(self.high)
        unit = ((x - low) / (high - low)).astype(F32)
        if not np.all((unit >= 0) & (unit <= 1)):
            raise ActionOutOfSupportError(
                f"Beta.logp: actions must lie in [{self.low}, {self.high}], "
                f"got {x[(unit < 0) | (unit > 1) | np.isnan(unit)].tolist()}"
            )
        pair = np.stack([unit, (F32(1.0) - unit).astype(F32)], axis=-1)
        return sum32(dirichlet_log_prob(self._conc, pair))

    def entropy(self) -> np.ndarray:
        return dirichlet_entropy(self._conc)
