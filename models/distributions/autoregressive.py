"""RLlib's example ``TorchBinaryAutoregressiveDistribution`` without the model (numpy).

RLlib's distribution calls back into the model (``action_module``) to get a2's logits for
the sampled a1. Served, the model's action head (``AutoregressiveActionModel.dist_head``)
instead evaluates a2's logits for *every* a1 value in the graph, so the dist inputs are

    (B, n1 + n1 * n2) = [a1 logits | a2 logits given a1 = 0 | ... | given a1 = n1 - 1]

and this class samples in RLlib's order (a1, then a2 from the block a1 selects) with any
random source, which gives seeded replay on the server.

RLlib's quirks are kept: ``logp`` takes the flattened ``(B, 2)`` action (a tuple works
too); ``entropy()`` is ``H(a1) + H(a2 | a1')`` with a *fresh* draw ``a1'`` (stochastic,
not the joint entropy); it draws from the generator of the last ``sample`` (or a new one).
``entropy_given(a1)`` is that value for a given ``a1'``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces as gs

from ._math import F32
from .base import ActionDistribution
from .categorical import _Cat, _check_indices, _reject_nan

__all__ = ["BinaryAutoregressive", "RLLIB_PATHS"]

RLLIB_PATHS = (
    "ray.rllib.examples._old_api_stack.models.autoregressive_action_dist.TorchBinaryAutoregressiveDistribution",
    "ray.rllib.examples.models.autoregressive_action_dist.TorchBinaryAutoregressiveDistribution",
)


def _leaves(action_space: gs.Space) -> tuple[int, int]:
    if not (isinstance(action_space, gs.Tuple) and len(action_space.spaces) == 2
            and all(isinstance(s, gs.Discrete) for s in action_space.spaces)):
        raise ValueError(f"binary_autoreg_dist needs a Tuple(Discrete, Discrete) action space, got {action_space!r}")
    first, second = (int(s.n) for s in action_space.spaces)  # type: ignore[attr-defined]
    return first, second


class BinaryAutoregressive(ActionDistribution):
    """Tuple(Discrete(n1), Discrete(n2)) with a2 conditioned on a1 (the example has n1 = n2 = 2)."""

    rllib_name: ClassVar[str] = "TorchBinaryAutoregressiveDistribution"

    def __init__(self, inputs: np.ndarray, n1: int = 2, n2: int = 2):
        super().__init__(inputs)
        if self.inputs.shape[1] != n1 + n1 * n2:
            raise ValueError(f"{type(self).__name__}: dist inputs need {n1 + n1 * n2} columns, got {self.inputs.shape}")
        _reject_nan(self.inputs, type(self).__name__)
        self.n1, self.n2 = int(n1), int(n2)
        self.a1 = _Cat(self.inputs[:, :n1], type(self).__name__)
        self._a2_logits = self.inputs[:, n1:].reshape(-1, n1, n2)
        self._rng: np.random.Generator | None = None

    @staticmethod
    def required_model_output_shape(action_space: gs.Space, model_config: dict[str, Any]) -> int:
        return 16  # RLlib's example: the context width the model outputs

    @staticmethod
    def dist_input_width(action_space: gs.Space, model_config: dict[str, Any]) -> int:
        n1, n2 = _leaves(action_space)
        return n1 + n1 * n2

    @classmethod
    def dist_kwargs(cls, action_space: gs.Space, model_config: dict[str, Any]) -> dict[str, Any]:
        n1, n2 = _leaves(action_space)
        return {"n1": n1, "n2": n2}

    def a2_logits(self, a1: Any) -> np.ndarray:
        """(B, n2) raw a2 logits given a1 (B,)."""
        idx = _check_indices(a1, self.n1, f"{type(self).__name__}: a1")
        return self._a2_logits[np.arange(self.batch_size), idx]

    def _sample(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        self._rng = rng
        a1 = self.a1.sample(rng)
        return a1, _Cat(self.a2_logits(a1), type(self).__name__).sample(rng)

    def _mode(self) -> tuple[np.ndarray, np.ndarray]:
        a1 = self.a1.mode()
        return a1, _Cat(self.a2_logits(a1), type(self).__name__).mode()

    def _columns(self, actions: Any) -> tuple[np.ndarray, np.ndarray]:
        if isinstance(actions, tuple | list):
            a1, a2 = (np.asarray(a) for a in actions)
        else:
            arr = self._check_batch(actions, "logp")
            if arr.ndim != 2 or arr.shape[1] != 2:
                raise ValueError(f"{type(self).__name__}.logp: expected (B, 2) actions or (a1, a2), got {arr.shape}")
            a1, a2 = arr[:, 0], arr[:, 1]
        self._check_batch(a1, "logp")
        self._check_batch(a2, "logp")
        return a1, a2

    def logp(self, actions: Any) -> np.ndarray:
        a1, a2 = self._columns(actions)
        where = f"{type(self).__name__}.logp"
        return (self.a1.logp(a1, where) + _Cat(self.a2_logits(a1), type(self).__name__).logp(a2, where)).astype(F32)

    def entropy_given(self, a1: Any) -> np.ndarray:
        """H(a1) + H(a2 | a1) for the given a1 (B,)."""
        return (self.a1.entropy() + _Cat(self.a2_logits(a1), type(self).__name__).entropy()).astype(F32)

    def entropy(self) -> np.ndarray:
        rng = self._rng if self._rng is not None else np.random.default_rng()
        return self.entropy_given(self.a1.sample(rng))
