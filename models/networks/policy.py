"""Adapter from a feedforward base model to the uniform policy contract (``models/interface.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from rlserve.models.interface import ModelSignature, OutputSpec
from rlserve.models.networks.common import num_outputs_of


class FeedForwardPolicy(nn.Module):
    """``forward(obs (B, *obs_shape)) -> (dist_inputs (B, num_outputs), value (B,))``.

    The base's parameters sit under ``base.``; RLlib's feedforward model *is* the base, so
    its keys map to the top level on import.
    """

    rllib_prefix_map = {"base.": ""}

    def __init__(self, base: nn.Module, obs_shape: Sequence[int] | None = None):
        super().__init__()
        self.base = base
        shape = obs_shape if obs_shape is not None else getattr(base, "obs_shape", None)
        if shape is None:
            raise ValueError(f"FeedForwardPolicy: pass obs_shape; {type(base).__name__} has no obs_shape")
        self.obs_shape = tuple(int(d) for d in shape)
        self.num_outputs = num_outputs_of(base)

    def signature(self) -> ModelSignature:
        return ModelSignature(obs_shape=self.obs_shape, num_outputs=self.num_outputs)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, value = self.base(obs)
        return out, value


class HeadedPolicy(FeedForwardPolicy):
    """A base with an action head: ``forward(obs) -> (dist_inputs, value, model_out, *extras)``.

    The base declares ``dist_head(model_out, value) -> (dist_inputs, value, *extras)``,
    ``dist_width`` (the dist inputs' width) and ``head_outputs`` (``(name, per-row shape)``
    of the extras). ``model_out`` is what RLlib's model returns (``num_outputs`` wide, as
    RLlib's ``model.num_outputs``): a DQN model's embedding, the autoregressive example's
    context. The server reads ``dist_inputs`` (``signature().num_outputs`` wide).
    """

    def __init__(self, base: nn.Module, obs_shape: Sequence[int] | None = None):
        super().__init__(base, obs_shape)
        head: Any = base  # the head protocol is duck-typed (see the class docstring)
        self.dist_width = int(head.dist_width)
        self.head_outputs = tuple((str(n), tuple(int(d) for d in s)) for n, s in head.head_outputs)
        self._dist_head = head.dist_head

    def signature(self) -> ModelSignature:
        extras = (OutputSpec("model_out", (self.num_outputs,)),
                  *(OutputSpec(name, shape) for name, shape in self.head_outputs))
        return ModelSignature(obs_shape=self.obs_shape, num_outputs=self.dist_width, extras=extras)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        out, value = self.base(obs)
        dist_inputs, value, *extras = self._dist_head(out, value)
        return (dist_inputs, value, out, *extras)
