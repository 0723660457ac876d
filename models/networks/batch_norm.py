"""RLlib's example ``TorchBatchNormModel`` (``examples/_old_api_stack/models/batch_norm_model.py``).

    obs (flat) -> [fc 256, relu, BatchNorm1d(256)] x 2 -> _logits (linear)
                                                       -> _value_branch (linear) -> value

Parameter and buffer names are RLlib's (``_hidden_layers.{0,2}`` fully connected,
``_hidden_layers.{1,3}`` batch norm with ``running_mean``, ``running_var`` and
``num_batches_tracked``), so RLlib's weights load as they are. The sizes are fixed (256,
256) as in RLlib's example; it takes no custom config.

Inference only. RLlib's model switches its hidden layers between training and eval mode
on every call from ``input_dict["is_training"]`` (absent = False, what a policy passes when
it computes actions). Here the batch norm always normalises with the running statistics
(``F.batch_norm(..., training=False)``), whatever ``.train()``/``.eval()`` says: a served
answer never updates the statistics and never depends on the other rows of its batch,
and the exported graph has no training branch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rlserve.models.networks.common import SlimFC, normc_initializer

RLLIB_PATHS = (
    "ray.rllib.examples._old_api_stack.models.batch_norm_model.TorchBatchNormModel",
    "ray.rllib.examples.models.batch_norm_model.TorchBatchNormModel",
)
HIDDEN = (256, 256)  # fixed in RLlib's example


class InferenceBatchNorm1d(nn.BatchNorm1d):
    """``nn.BatchNorm1d`` (same parameters and buffers) that normalises with its running
    statistics in either mode and never updates them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)


class TorchBatchNormModel(nn.Module):
    """Base-model contract: ``forward(obs (B, *obs)) -> (logits (B, n), value (B,))``."""

    rllib_class_name = "TorchBatchNormModel"

    def __init__(
        self,
        obs_space: Any,
        action_space: Any,
        num_outputs: int | None,
        model_config: Mapping[str, Any],
        name: str = "batch_norm",
        **unused: Any,
    ) -> None:
        super().__init__()
        if not num_outputs:
            raise ValueError("TorchBatchNormModel: needs num_outputs (RLlib's example has no feature-only form)")
        self.obs_shape = tuple(int(d) for d in obs_space.shape)
        self.num_outputs = int(num_outputs)
        layers: list[nn.Module] = []
        width = int(np.prod(self.obs_shape))
        for size in HIDDEN:
            layers += [SlimFC(width, size, normc_initializer(1.0), "relu"), InferenceBatchNorm1d(size)]
            width = size
        self._hidden_layers = nn.Sequential(*layers)
        self._logits = SlimFC(width, self.num_outputs, normc_initializer(0.01))
        self._value_branch = SlimFC(width, 1, normc_initializer(1.0))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self._hidden_layers(obs.reshape(obs.shape[0], -1).float())
        return self._logits(hidden), self._value_branch(hidden).reshape(-1)
