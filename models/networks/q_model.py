"""DQN's torch Q-model: RLlib's ``DQNTorchModel`` on a catalog base, with the policy's
dueling combination in the graph.

RLlib builds it in ``dqn_torch_policy.build_q_model_and_distribution``: the catalog's base
model (num_outputs by ``q_config.q_num_outputs``), plus ``advantage_module`` (``dueling_A_i``
SlimFC layers, then ``A``) and, when dueling, ``value_module`` (``dueling_V_i``, then ``V``).
Its ``get_q_value_distributions`` returns the advantages A, and the policy's
``compute_q_values`` makes ``Q = V + (A - reduce_mean_ignore_inf(A))``; here both happen in
``dist_head`` so an exported graph outputs the Q-values as its dist inputs.

Empty ``hiddens`` leave both modules empty (identity), exactly as RLlib's Sequentials: the
advantages are the base's logits and, if dueling, the "state value" is the same tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from rlserve.models.networks.common import SlimFC, num_outputs_of

__all__ = ["DQNModel", "reduce_mean_ignore_inf"]


def reduce_mean_ignore_inf(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Mean over ``dim`` skipping -inf entries (RLlib's ``reduce_mean_ignore_inf``)."""
    mask = x != float("-inf")
    return torch.where(mask, x, torch.zeros_like(x)).sum(dim) / mask.float().sum(dim)


def _head_module(side: str, ins: int, q: Mapping[str, Any], final: int) -> nn.Sequential:
    module = nn.Sequential()
    for i, n in enumerate(q["hiddens"]):
        module.add_module(f"dueling_{side}_{i}", SlimFC(ins, n, activation=q["dueling_activation"]))
        if q["add_layer_norm"]:
            module.add_module(f"LayerNorm_{side}_{i}", nn.LayerNorm(n))
        ins = n
    if q["hiddens"]:
        module.add_module(side, SlimFC(ins, final))
    return module


class DQNModel(nn.Module):
    """``forward(obs) -> (model_out, base value)``;
    ``dist_head(model_out, base value) -> (Q, max_a Q, A[, V], base value)``.

    The served ``value`` is ``max_a Q``, the value of the greedy policy: DQN never trains
    the base's value branch (RLlib lists it as unreached), so it is only an extra output.

    RLlib's class is ``<Base>_as_DQNTorchModel``: the base's parameters sit at the top
    level of its state_dict, next to ``advantage_module.*`` and ``value_module.*``.
    """

    rllib_prefix_map = {"net.": ""}

    def __init__(self, net: nn.Module, n_actions: int, q: Mapping[str, Any]):
        super().__init__()
        self.net = net
        self.dueling = bool(q["dueling"])
        ins = num_outputs_of(net)
        self.num_outputs = ins
        self.advantage_module = _head_module("A", ins, q, n_actions)
        if self.dueling:
            self.value_module = _head_module("V", ins, q, 1)
        self.dist_width = int(n_actions)
        width = q["hiddens"][-1] if q["hiddens"] else ins
        self.head_outputs: tuple[tuple[str, tuple[int, ...]], ...] = (("advantages", (int(n_actions),)),)
        if self.dueling:
            self.head_outputs += (("state_value", (1 if q["hiddens"] else width,)),)
        self.head_outputs += (("base_value", ()),)
        self.rllib_class_name = f"{getattr(net, 'rllib_class_name', type(net).__name__)}_as_DQNTorchModel"

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.net(obs)

    def dist_head(self, model_out: torch.Tensor, base_value: torch.Tensor) -> tuple[torch.Tensor, ...]:
        advantages = self.advantage_module(model_out)
        if not self.dueling:
            return advantages, advantages.max(dim=1).values, advantages, base_value
        state_value = self.value_module(model_out)
        centered = advantages - reduce_mean_ignore_inf(advantages, 1).unsqueeze(1)
        q_values = state_value + centered
        return q_values, q_values.max(dim=1).values, advantages, state_value, base_value
