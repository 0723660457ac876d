"""A served Q-policy: greedy or epsilon-greedy over the Q-values (numpy).

RLlib's DQN acts through its ``EpsilonGreedy`` exploration, not through the action
distribution it names (``TorchCategoricalWithTemperature`` over the Q-values, used only by
SoftQ exploration). Here the dist inputs are the Q-values ``(B, n)``:

- ``deterministic_sample()`` (explore off): ``argmax Q`` (first maximum, as torch).
- ``sample(rng)`` (explore on): with probability epsilon a uniformly random *valid* action
  (Q above RLlib's FLOAT_MIN, so masked actions are never drawn), else ``argmax Q``.
- ``logp(a)``: the log-probability of ``a`` under the policy actually served,
  ``log((1 - eps) [a = argmax Q] + eps / n_valid)``; 0 for the greedy action when eps = 0.
  RLlib's EpsilonGreedy reports 0 for every action, which is wrong for the random ones
  (importance weights computed from it would be off); a masked action gets -inf.
- ``entropy()``: the entropy of that same action distribution.

``epsilon`` is the model's (``q_model.epsilon``); ``set_epsilon`` overrides it per row
(a request's own epsilon).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces as gs

from ._math import F32
from .base import ActionDistribution
from .categorical import _check_indices, _reject_nan

__all__ = ["EpsilonGreedyQ"]

# RLlib's FLOAT_MIN (masking.py): a masked Q-value is at or below it.
FLOAT_MIN = np.float32(-3.4e38)


class EpsilonGreedyQ(ActionDistribution):
    rllib_name: ClassVar[str] = "EpsilonGreedyQ"
    inputs_are_q_values: ClassVar[bool] = True

    def __init__(self, inputs: np.ndarray, epsilon: float = 0.0):
        super().__init__(inputs)
        _reject_nan(self.inputs, type(self).__name__)
        self.valid = self.inputs > F32(FLOAT_MIN)
        self.epsilon = np.full(self.batch_size, float(epsilon), np.float64)

    @staticmethod
    def required_model_output_shape(action_space: gs.Space, model_config: dict[str, Any]) -> int:
        return int(action_space.n)  # type: ignore[attr-defined]

    def set_epsilon(self, epsilon: np.ndarray) -> None:
        """Per-row epsilon (B,); NaN rows keep the model's."""
        eps = np.asarray(epsilon, np.float64)
        self.epsilon = np.where(np.isnan(eps), self.epsilon, eps)

    def probs(self) -> np.ndarray:
        """(B, n) probability of each action under the epsilon-greedy policy."""
        n_valid = np.maximum(self.valid.sum(axis=1), 1)
        greedy = np.zeros(self.inputs.shape, np.float64)
        greedy[np.arange(self.batch_size), self._mode()] = 1.0
        eps = self.epsilon[:, None]
        return (1.0 - eps) * greedy + np.where(self.valid, eps / n_valid[:, None], 0.0)

    def _sample(self, rng: np.random.Generator) -> np.ndarray:
        greedy = self._mode()
        explore = rng.random(self.batch_size) < self.epsilon
        # Uniform over the valid actions: the k-th valid one for k ~ U{0..n_valid-1}.
        n_valid = np.maximum(self.valid.sum(axis=1), 1)
        k = np.minimum((rng.random(self.batch_size) * n_valid).astype(np.int64), n_valid - 1)
        random = np.argmax(np.cumsum(self.valid, axis=1) > k[:, None], axis=1)
        return np.where(explore, random, greedy).astype(np.int64)

    def _mode(self) -> np.ndarray:
        return np.argmax(self.inputs, axis=1).astype(np.int64)

    def logp(self, actions: Any) -> np.ndarray:
        arr = self._check_batch(actions, "logp")
        if arr.ndim == 2 and arr.shape[1] == 1:
            arr = arr[:, 0]
        idx = _check_indices(arr, self.inputs.shape[1], f"{type(self).__name__}.logp")
        p = self.probs()[np.arange(self.batch_size), idx]
        with np.errstate(divide="ignore"):
            return np.log(p).astype(F32)

    def entropy(self) -> np.ndarray:
        p = self.probs()
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
        return (-terms.sum(axis=1)).astype(F32)
