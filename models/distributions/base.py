"""The action-distribution contract and its errors (numpy, torch-free).

A distribution is built from one batch of dist inputs ``(B, N)`` float32 (the model's
``dist_inputs`` output) and answers, batch-first:

    sample(rng)            a sampled action (structure of the action space), leading B
    deterministic_sample() the mode RLlib uses for ``explore=False``
    logp(actions)          (B,) float32 log-likelihood
    entropy()              (B,) float32 (Beta: (B, D), as RLlib)
    sampled_action_logp()  logp of the last ``sample``/``deterministic_sample``
    logp_of_sample()       the same as ``logp(last sample)``, skipping the support check

Each class mirrors one class of RLlib 2.60's ``torch_action_dist``; the arithmetic is done
in float32 in the same order as torch so that the results agree to ~1e-6 relative.
Where RLlib raises (Deterministic.logp, SquashedGaussian.entropy, out-of-support
actions), we raise a subclass of :class:`DistributionError` (a ``ValueError``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces as gs

__all__ = [
    "ActionDistribution",
    "ActionOutOfSupportError",
    "DistributionError",
    "UnsupportedMethodError",
]


class DistributionError(ValueError):
    """Base of every error a distribution raises on purpose."""


class UnsupportedMethodError(DistributionError):
    """The method is undefined for this distribution (RLlib raises there too)."""


class ActionOutOfSupportError(DistributionError):
    """``logp`` was asked for actions outside the distribution's support."""


def check_inputs(inputs: Any, name: str) -> np.ndarray:
    """Dist inputs as a float32 ``(B, N)`` array, or a ValueError saying what was received."""
    arr = np.asarray(inputs)
    if arr.ndim != 2:
        raise ValueError(f"{name}: dist inputs must have shape (B, N), got shape {arr.shape}")
    if arr.dtype.kind not in "fiu":
        raise ValueError(f"{name}: dist inputs must be numeric, got dtype {arr.dtype}")
    return arr.astype(np.float32, copy=False)


class ActionDistribution(ABC):
    """Base class: holds the ``(B, N)`` inputs and the last sample."""

    #: RLlib's class name, e.g. "TorchCategorical" (the spec's ``name``).
    rllib_name: ClassVar[str] = ""
    #: True when the inputs are a Q-policy's Q-values (served as ``q_values``; the
    #: distribution then takes a per-row exploration rate through ``set_epsilon``).
    inputs_are_q_values: ClassVar[bool] = False

    def __init__(self, inputs: np.ndarray):
        self.inputs = check_inputs(inputs, type(self).__name__)
        self.last_sample: Any = None

    @property
    def batch_size(self) -> int:
        return int(self.inputs.shape[0])

    @staticmethod
    def required_model_output_shape(action_space: gs.Space, model_config: dict[str, Any]) -> int:
        """How many dist inputs (model outputs) this distribution needs for ``action_space``."""
        raise NotImplementedError

    # -- the contract --------------------------------------------------------------
    def sample(self, rng: np.random.Generator) -> Any:
        self.last_sample = self._sample(rng)
        return self.last_sample

    def deterministic_sample(self) -> Any:
        self.last_sample = self._mode()
        return self.last_sample

    def sampled_action_logp(self) -> np.ndarray:
        """logp of the last ``sample()``/``deterministic_sample()`` (RLlib's contract)."""
        if self.last_sample is None:
            raise DistributionError(
                f"{type(self).__name__}.sampled_action_logp: call sample() or deterministic_sample() first"
            )
        return self.logp(self.last_sample)

    def logp_of_sample(self) -> np.ndarray:
        """``logp`` of the last ``sample()``/``deterministic_sample()``, without checking that
        sample against the support again: it came from this distribution. Unlike
        ``sampled_action_logp`` it raises where ``logp`` raises (Deterministic). The server
        calls it once per batch; distributions with a cheaper path override ``_own_logp``."""
        if self.last_sample is None:
            raise DistributionError(f"{type(self).__name__}.logp_of_sample: call sample() first")
        return self._own_logp(self.last_sample)

    def _own_logp(self, sample: Any) -> np.ndarray:
        return self.logp(sample)

    @abstractmethod
    def _sample(self, rng: np.random.Generator) -> Any: ...

    @abstractmethod
    def _mode(self) -> Any: ...

    @abstractmethod
    def logp(self, actions: Any) -> np.ndarray: ...

    @abstractmethod
    def entropy(self) -> np.ndarray: ...

    def _check_batch(self, actions: np.ndarray, what: str) -> np.ndarray:
        arr = np.asarray(actions)
        if arr.ndim == 0 or arr.shape[0] != self.batch_size:
            raise ValueError(
                f"{type(self).__name__}.{what}: actions need a leading batch axis of "
                f"{self.batch_size}, got shape {arr.shape}"
            )
        return arr
