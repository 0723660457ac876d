"""Dirichlet (Simplex actions), plus the Dirichlet log-density/entropy Beta reuses.

RLlib: ``concentration = exp(x) + 1e-7``; the mode is ``softmax(concentration)`` (not the
Dirichlet mean); ``logp`` first clamps the action at 1e-7 and renormalises it to sum 1,
then torch validates the result lies on the simplex. Samples are drawn with numpy
(normalised Gamma draws), which is the same distribution but not the same stream as torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces as gs

from ..spaces import shape_of
from ._math import F32, as_f32, digamma32, lgamma32, softmax32, xlogy32
from .base import ActionDistribution, ActionOutOfSupportError

__all__ = ["Dirichlet", "dirichlet_entropy", "dirichlet_log_prob"]

_EPS = F32(1e-7)


def dirichlet_log_prob(conc: np.ndarray, value: np.ndarray) -> np.ndarray:
    """torch Dirichlet.log_prob over the last axis, float32, same op order."""
    conc = as_f32(conc)
    term = np.sum(xlogy32(conc - F32(1.0), value), axis=-1, dtype=F32)
    # Left to right as torch: the terms are ~1e8 for large concentrations and cancel.
    out = (term + lgamma32(np.sum(conc, axis=-1, dtype=F32))).astype(F32)
    return (out - np.sum(lgamma32(conc), axis=-1, dtype=F32)).astype(F32)


def dirichlet_entropy(conc: np.ndarray) -> np.ndarray:
    """torch Dirichlet.entropy over the last axis, float32, same op order."""
    conc = as_f32(conc)
    k = F32(conc.shape[-1])
    a0 = np.sum(conc, axis=-1, dtype=F32)
    out = (np.sum(lgamma32(conc), axis=-1, dtype=F32) - lgamma32(a0)).astype(F32)
    out = (out - ((k - a0) * digamma32(a0)).astype(F32)).astype(F32)
    tail = np.sum(((conc - F32(1.0)) * digamma32(conc)).astype(F32), axis=-1, dtype=F32)
    return (out - tail).astype(F32)


def sample_dirichlet(conc: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One draw per row of a (B, K) concentration (float32)."""
    conc64 = np.asarray(conc, dtype=np.float64)
    gamma = rng.standard_gamma(conc64)
    total = gamma.sum(axis=-1, keepdims=True)
    out = gamma / np.where(total > 0, total, 1.0)
    # All-zero Gamma draws happen for tiny concentrations; numpy's own sampler copes.
    for row in np.flatnonzero(~(total[:, 0] > 0) | ~np.isfinite(total[:, 0])):
        out[row] = rng.dirichlet(conc64[row])
    return out.astype(F32)


class Dirichlet(ActionDistribution):
    """``(B, K)`` inputs -> ``(B, K)`` points on the simplex."""

    rllib_name = "TorchDirichlet"

    def __init__(self, inputs: np.ndarray):
        super().__init__(inputs)
        with np.errstate(over="ignore"):
            self.concentration = (np.exp(self.inputs) + _EPS).astype(F32)
        if not np.all(self.concentration > 0):  # torch validates (validate_args=True)
            raise ActionOutOfSupportError("Dirichlet: concentration must be positive (NaN inputs?)")

    @staticmethod
    def required_model_output_shape(action_space: gs.Space, model_config: dict[str, Any]) -> int:
        return int(np.prod(shape_of(action_space), dtype=np.int64))

    def _sample(self, rng: np.random.Generator) -> np.ndarray:
        return sample_dirichlet(self.concentration, rng)

    def _mode(self) -> np.ndarray:
        return softmax32(self.concentration)

    def logp(self, actions: Any) -> np.ndarray:
        x = as_f32(self._check_batch(actions, "logp"))
        if x.shape != self.concentration.shape:
            raise ValueError(f"Dirichlet.logp: expected actions of shape {self.concentration.shape}, got {x.shape}")
        x = np.maximum(x, _EPS).astype(F32)
        x = (x / np.sum(x, axis=-1, keepdims=True, dtype=F32)).astype(F32)
        off = ~(np.abs(np.sum(x, axis=-1, dtype=F32) - F32(1.0)) < 1e-6)
        if off.any():
            raise ActionOutOfSupportError(
                f"Dirichlet.logp: actions in rows {np.flatnonzero(off).tolist()} are not on the simplex"
            )
        return dirichlet_log_prob(self.concentration, x)

    def entropy(self) -> np.ndarray:
        return dirichlet_entropy(self.concentration)
