"""RLlib's autoregressive-action example model (``TorchAutoregressiveActionModel``).

Layers and state_dict keys as the example: ``context_layer`` (obs -> num_outputs, normc
1.0, tanh), ``value_branch`` (normc 0.01), ``a1_logits`` (normc 0.01) and
``action_module.a2_hidden`` (1 -> 16, tanh) / ``action_module.a2_logits`` (16 -> 2). As in
the example, a2's logits read only the float a1 (not the context).

``forward(obs) -> (context, value)`` is RLlib's ``model_out``/``value_function()``. For
serving, ``dist_head(context)`` evaluates a2's logits for both a1 values in the graph, so
the exported model needs neither this class nor a second call per action:
dist inputs ``(B, 6) = [a1 logits | a2 logits given a1 = 0 | given a1 = 1]``, which
``distributions.BinaryAutoregressive`` samples in order.
"""

from __future__ import annotations

from typing import Any

import gymnasium.spaces as gs
import torch
from torch import nn

from rlserve.models.networks.common import SlimFC, normc_initializer

__all__ = ["RLLIB_PATHS", "AutoregressiveActionModel"]

RLLIB_PATHS = (
    "ray.rllib.examples._old_api_stack.models.autoregressive_action_model.TorchAutoregressiveActionModel",
    "ray.rllib.examples.models.autoregressive_action_model.TorchAutoregressiveActionModel",
)
_A1_VALUES = (0.0, 1.0)


class _ActionModule(nn.Module):
    """a2 logits from the float a1 column (the example's ``_ActionModel`` without its closure)."""

    def __init__(self) -> None:
        super().__init__()
        self.a2_hidden = SlimFC(1, 16, normc_initializer(1.0), activation="tanh")
        self.a2_logits = SlimFC(16, 2, normc_initializer(0.01))

    def forward(self, a1: torch.Tensor) -> torch.Tensor:
        return self.a2_logits(self.a2_hidden(a1))


class AutoregressiveActionModel(nn.Module):
    rllib_class_name = "TorchAutoregressiveActionModel"

    def __init__(self, obs_space: gs.Space, action_space: gs.Space, num_outputs: int | None,
                 model_config: dict[str, Any], name: str, **_: Any):
        super().__init__()
        expected = gs.Tuple([gs.Discrete(2), gs.Discrete(2)])
        if action_space != expected:
            raise ValueError(f"autoregressive_model: only the action space {expected} is supported, got {action_space}")
        if not (isinstance(obs_space, gs.Box) and len(obs_space.shape) == 1):
            raise ValueError(f"autoregressive_model: needs a 1-D Box (model) observation space, got {obs_space}")
        if not num_outputs:
            raise ValueError("autoregressive_model: num_outputs (the context width) must be a positive int")
        self.num_outputs = int(num_outputs)
        self.context_layer = SlimFC(obs_space.shape[0], self.num_outputs, normc_initializer(1.0), activation="tanh")
        self.value_branch = SlimFC(self.num_outputs, 1, normc_initializer(0.01))
        self.a1_logits = SlimFC(self.num_outputs, 2, normc_initializer(0.01))
        self.action_module = _ActionModule()
        self.dist_width = 2 + 2 * len(_A1_VALUES)
        self.head_outputs: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        context = self.context_layer(obs)
        return context, self.value_branch(context).reshape(-1)

    def dist_head(self, context: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        column = torch.zeros_like(context[:, :1])
        a2 = [self.action_module(column + a1) for a1 in _A1_VALUES]
        return torch.cat([self.a1_logits(context), *a2], dim=1), value
