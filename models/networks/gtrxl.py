"""RLlib's AttentionWrapper (GTrXL) around a base model, one step per call.

Data flow of one step (B rows):
    obs -> base -> cat(features, one_hot(prev_a_0..n-1), prev_r_0..n-1)   (oldest first)
        -> gtrxl.linear_layer (no activation) = input of unit 0
        -> per unit k: x = GRU(x, MHA(x, memory_k)); x = GRU(x, MLP(x))
        -> _logits_branch / _value_branch on the last unit's output.
The memory of unit k holds its past *inputs* (B, M, D), oldest first; the model returns it
rolled by one step (``cat(memory[:, 1:], input)``), so the server stores state without
knowing what it means. RLlib returns only the new row; ours ends in that same row.

Prev actions of a MultiDiscrete space are one-hot encoded per component and step (RLlib's
own MultiDiscrete branch slices the wrong axis and fails to concatenate).
"""

from __future__ import annotations

import gymnasium.spaces as gs
import torch
from torch import nn

from rlserve.models.interface import ModelSignature, PrevSpec, StateSpec
from rlserve.models.networks.attention_modules import GatedAttentionSkip, GatedMLPSkip
from rlserve.models.networks.common import SlimFC, num_outputs_of
from rlserve.models.networks.wrapper_inputs import (
    PrevActionEncoder,
    base_features,
    non_negative_int,
    positive_int,
    shadow_base_value_head,
)
from rlserve.models.spaces import shape_of


class GTrXLCore(nn.Module):
    """``linear_layer`` plus L transformer units (``attention_layers`` 2k = MHA, 2k+1 = MLP)."""

    def __init__(
        self,
        in_size: int,
        dim: int,
        num_units: int,
        num_heads: int,
        head_dim: int,
        mlp_dim: int,
        gate_bias: float,
    ) -> None:
        super().__init__()
        self.linear_layer = SlimFC(in_size, dim)
        layers: list[nn.Module] = []
        for _ in range(num_units):
            layers.append(GatedAttentionSkip(dim, num_heads, head_dim, gate_bias))
            layers.append(GatedMLPSkip(dim, mlp_dim, gate_bias))
        self.attention_layers = nn.ModuleList(layers)

    def forward(
        self, x: torch.Tensor, memories: list[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """x ``(B, T, in)``, memories L x ``(B, Tau, D)`` -> (out ``(B, T, D)``, unit inputs L x ``(B, T, D)``)."""
        h = self.linear_layer(x)
        unit_inputs = []
        for k in range(len(self.attention_layers) // 2):
            unit_inputs.append(h)
            h = self.attention_layers[2 * k](h, memories[k])
            h = self.attention_layers[2 * k + 1](h)
        return h, unit_inputs


class AttentionWrapper(nn.Module):
    """``forward(obs, memory_0..L-1, [prev_actions (B,n,A)], [prev_rewards (B,n)])``
    -> ``(dist_inputs (B, num_outputs), value (B,), memory_out_0..L-1 (B, M, D))``."""

    # RLlib's wrapper *is* the wrapped model, so the base's keys sit at the top level.
    rllib_prefix_map = {"base.": ""}

    def __init__(
        self,
        base: nn.Module,
        obs_space: gs.Space,
        action_space: gs.Space,
        num_outputs: int,
        model_config: dict,
    ) -> None:
        super().__init__()
        cfg = model_config
        self.num_outputs = int(num_outputs)
        self.obs_shape = tuple(int(s) for s in shape_of(obs_space))
        self.num_units = positive_int(cfg, "attention_num_transformer_units")
        self.dim = positive_int(cfg, "attention_dim")
        self.memory = positive_int(cfg, "attention_memory_inference")
        self.n_prev_actions = non_negative_int(cfg, "attention_use_n_prev_actions")
        self.n_prev_rewards = non_negative_int(cfg, "attention_use_n_prev_rewards")

        shadow_base_value_head(base)
        self.base = base
        self.action_encoder = PrevActionEncoder(action_space) if self.n_prev_actions else None
        in_size = num_outputs_of(base) + self.n_prev_rewards
        if self.action_encoder is not None:
            in_size += self.n_prev_actions * self.action_encoder.out_width
        self.gtrxl = GTrXLCore(
            in_size,
            self.dim,
            self.num_units,
            positive_int(cfg, "attention_num_heads"),
            positive_int(cfg, "attention_head_dim"),
            positive_int(cfg, "attention_position_wise_mlp_dim"),
            float(cfg["attention_init_gru_gate_bias"]),
        )
        self._logits_branch = SlimFC(self.dim, self.num_outputs)
        self._value_branch = SlimFC(self.dim, 1)

    def signature(self) -> ModelSignature:
        width = self.action_encoder.in_width if self.action_encoder is not None else 0
        return ModelSignature(
            obs_shape=self.obs_shape,
            num_outputs=self.num_outputs,
            state=tuple(
                StateSpec(f"memory_{k}", (self.memory, self.dim)) for k in range(self.num_units)
            ),
            prev=PrevSpec(self.n_prev_actions, self.n_prev_rewards, width, windowed=True),
        )

    def initial_state(self, batch: int) -> list[torch.Tensor]:
        """Zero memories, ``L x (B, M, D)`` (RLlib tiles ``zeros(D)`` M times)."""
        return [torch.zeros(batch, self.memory, self.dim) for _ in range(self.num_units)]

    def _gtrxl_input(self, obs: torch.Tensor, prev: tuple[torch.Tensor, ...]) -> torch.Tensor:
        parts = [base_features(self.base, obs)]
        batch = parts[0].shape[0]
        if self.action_encoder is not None:
            parts.append(self.action_encoder(prev[0]).reshape(batch, -1))
        if self.n_prev_rewards:
            parts.append(prev[-1].to(torch.float32).reshape(batch, self.n_prev_rewards))
        return torch.cat(parts, dim=1)

    def forward(self, obs: torch.Tensor, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        expected = self.num_units + int(self.n_prev_actions > 0) + int(self.n_prev_rewards > 0)
        if len(inputs) != expected:
            names = self.signature().input_names[1:]
            raise ValueError(
                f"AttentionWrapper: expected inputs {names} after obs, received {len(inputs)} tensors"
            )
        memories = list(inputs[: self.num_units])
        x = self._gtrxl_input(obs, inputs[self.num_units :])
        out, unit_inputs = self.gtrxl(x[:, None], memories)
        features = out[:, -1]
        logits = self._logits_branch(features)
        value = self._value_branch(features).reshape(-1)
        rolled = [
            torch.cat([m[:, 1:], new], dim=1) for m, new in zip(memories, unit_inputs, strict=True)
        ]
        return (logits, value, *rolled)
