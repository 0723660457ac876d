"""Custom models that declare their own signature: recurrent state (and, later, views).

A plain custom model follows the base-model contract (``forward(obs) -> (out, value)``)
and the catalog wraps it. A class derived from ``RecurrentCustomModel`` instead *is* a
policy model (``models/interface.py``): it declares its state per row through
``initial_state()`` (RLlib's ``get_initial_state``) and implements one step,

    forward_step(obs (B, *obs_shape), state [(B, *shape_i)]) -> (out (B, n), value (B,), [new state])

which ``forward(obs, *state_in)`` exposes positionally for export. The server keeps the
state per session like the built-in LSTM's and feeds ``initial_state()`` at an episode
start. Each state tensor starts at one constant (``StateSpec.initial_value``); an initial
state with differing entries is refused at build.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from rlserve.models.interface import ModelSignature, StateSpec

__all__ = ["RecurrentCustomModel", "declares_signature"]


def declares_signature(cls: type) -> bool:
    """True for custom classes that are policy models themselves (the catalog does not wrap them)."""
    return isinstance(cls, type) and issubclass(cls, RecurrentCustomModel)


def _state_spec(index: int, value: Any) -> StateSpec:
    array = np.asarray(value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value, np.float32)
    first = float(array.ravel()[0]) if array.size else 0.0
    if array.size and not np.all(array == first):
        raise ValueError(
            f"custom model initial_state()[{index}]: expected one constant per state tensor, "
            f"received values from {float(array.min())} to {float(array.max())}"
        )
    return StateSpec(f"state_{index}", tuple(int(d) for d in array.shape), "float32", first)


class RecurrentCustomModel(nn.Module):
    """Base class of a custom model with its own recurrent state.

    Subclasses set ``self.num_outputs`` and ``self.obs_shape`` (the flat observation shape
    the model reads) in ``__init__`` and implement ``initial_state`` and ``forward_step``.
    """

    num_outputs: int
    obs_shape: tuple[int, ...]

    def initial_state(self) -> Sequence[Any]:
        """The state of one row at an episode start: arrays or tensors, one per state tensor."""
        raise NotImplementedError

    def forward_step(
        self, obs: torch.Tensor, state: list[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        raise NotImplementedError

    def signature(self) -> ModelSignature:
        return ModelSignature(
            obs_shape=tuple(self.obs_shape),
            num_outputs=int(self.num_outputs),
            state=tuple(_state_spec(i, s) for i, s in enumerate(self.initial_state())),
        )

    def forward(self, obs: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out, value, new_state = self.forward_step(obs, list(state))
        return (out, value, *new_state)
