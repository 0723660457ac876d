"""Deterministic: the dist inputs are the action (RLlib's DDPG/TD3 distribution).

``sample`` and ``deterministic_sample`` return the ``(B, D)`` inputs and
``sampled_action_logp`` is zeros. ``logp`` and ``entropy`` do not exist in RLlib (they
crash with an AttributeError); here they raise :class:`UnsupportedMethodError`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces as gs

from ..spaces import shape_of
from .base import ActionDistribution, UnsupportedMethodError

__all__ = ["Deterministic"]


class Deterministic(ActionDistribution):
    rllib_name = "TorchDeterministic"

    @staticmethod
    def required_model_output_shape(action_space: gs.Space, model_config: dict[str, Any]) -> int:
        return int(np.prod(shape_of(action_space), dtype=np.int64))

    def _sample(self, rng: np.random.Generator) -> np.ndarray:
        return self.inputs.copy()

    def _mode(self) -> np.ndarray:
        return self.inputs.copy()

    def sampled_action_logp(self) -> np.ndarray:
        return np.zeros(self.batch_size, dtype=np.float32)

    def logp(self, actions: Any) -> np.ndarray:
        raise UnsupportedMethodError("Deterministic: logp is not defined (RLlib has none)")

    def entropy(self) -> np.ndarray:
        raise UnsupportedMethodError("Deterministic: entropy is not defined (RLlib has none)")
