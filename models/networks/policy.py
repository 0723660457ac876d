"""Adapter from a feedforward base model to the uniform policy contract (``models/interface.py``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from rlserve.models.interface import ModelSignature
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
