"""The new API stack's ``TorchSquashedGaussian`` (SAC's RLModule distribution), numpy.

Differs from the old stack's ``SquashedGaussian`` (``gaussian.py``) in three places, as
RLlib 2.60's ``ray.rllib.core.distribution.torch.torch_distribution`` computes it:

- the deterministic action is the raw ``loc`` (``to_deterministic()`` is
  ``TorchDeterministic(loc)``), *not* ``tanh(loc)``: the module-to-env connector then
  unsquashes and clips it for the environment;
- ``logp(a)`` is the Normal log-density of ``u = atanh(clip(normalised a, -1+1e-6, 1-1e-6))``
  summed over the action dims, minus ``sum 2 * (log 2 - u - softplus(-2u))`` (the exact
  tanh Jacobian), with no clamp of the density;
- ``from_logits`` clamps log_std to [-5, 2] (as the old one) and ``low``/``high`` are the
  class's -1/1, not the environment's bounds.

Samples are ``clip(((tanh(z) + 1) / 2) * (high - low) + low)`` with ``z ~ N(loc, std)``.
Entropy is undefined (RLlib raises).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._math import F32, sum32
from .base import UnsupportedMethodError
from .gaussian import SquashedGaussian, _check_actions, _normal_log_prob

__all__ = ["RLModuleSquashedGaussian"]

_LOG_2 = F32(math.log(2.0))


def _softplus(x: np.ndarray) -> np.ndarray:
    """torch's softplus (beta 1, threshold 20): x itself above 20."""
    with np.errstate(over="ignore"):
        return np.where(x > F32(20.0), x, np.log1p(np.exp(x))).astype(F32)


class RLModuleSquashedGaussian(SquashedGaussian):
    rllib_name = "RLModuleTorchSquashedGaussian"

    def _mode(self) -> np.ndarray:
        return self.mean.copy()

    def logp(self, actions: Any) -> np.ndarray:
        u = self._unsquash(_check_actions(self, actions, self.mean.shape[1]))
        gauss = sum32(_normal_log_prob(u, self.mean, self.std))
        jacobian = (F32(2.0) * (_LOG_2 - u - _softplus((F32(-2.0) * u).astype(F32)))).astype(F32)
        return (gauss - np.sum(jacobian, axis=-1, dtype=F32)).astype(F32)

    def entropy(self) -> np.ndarray:
        raise UnsupportedMethodError("RLModuleSquashedGaussian: entropy is not defined (RLlib raises too)")
