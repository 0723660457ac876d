"""RLlib's LSTMWrapper around a base model: one step per call, or a whole sequence.

    obs -> base -> cat(features, prev_action (one-hot if discrete), prev_reward)
        -> nn.LSTM(batch_first, torch gate order i,f,g,o) -> _logits_branch / _value_branch

Both heads read the LSTM output; the base's own value head is never used. Unlike RLlib
2.60, which crashes building an LSTM over a Discrete/MultiDiscrete previous action
(np.int64 input size, see SKIPPED.md), this wrapper one-hot encodes it as RLlib intends.
"""

from __future__ import annotations

import gymnasium.spaces as gs
import torch
from torch import nn

from rlserve.models.interface import ModelSignature, PrevSpec, StateSpec
from rlserve.models.networks.common import SlimFC, num_outputs_of
from rlserve.models.networks.wrapper_inputs import (
    PrevActionEncoder,
    base_features,
    positive_int,
    shadow_base_value_head,
)
from rlserve.models.spaces import shape_of


class LSTMWrapper(nn.Module):
    """``forward(obs (B,*obs), h (B,C), c (B,C), [prev_actions (B,A)], [prev_rewards (B,)])``
    -> ``(dist_inputs (B, num_outputs), value (B,), h_out (B,C), c_out (B,C))``."""

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
        self.num_outputs = int(num_outputs)
        self.obs_shape = tuple(int(s) for s in shape_of(obs_space))
        self.cell_size = positive_int(model_config, "lstm_cell_size")
        self.use_prev_action = bool(model_config.get("lstm_use_prev_action"))
        self.use_prev_reward = bool(model_config.get("lstm_use_prev_reward"))

        shadow_base_value_head(base)
        self.base = base
        self.action_encoder = PrevActionEncoder(action_space) if self.use_prev_action else None
        in_size = num_outputs_of(base) + int(self.use_prev_reward)
        if self.action_encoder is not None:
            in_size += self.action_encoder.out_width
        # Default torch init: RLlib ignores lstm_*_initializer for the wrapper's LSTM.
        self.lstm = nn.LSTM(in_size, self.cell_size, batch_first=True)
        self._logits_branch = SlimFC(self.cell_size, self.num_outputs)
        self._value_branch = SlimFC(self.cell_size, 1)

    def signature(self) -> ModelSignature:
        width = self.action_encoder.in_width if self.action_encoder is not None else 0
        return ModelSignature(
            obs_shape=self.obs_shape,
            num_outputs=self.num_outputs,
            state=(StateSpec("h", (self.cell_size,)), StateSpec("c", (self.cell_size,))),
            prev=PrevSpec(
                int(self.use_prev_action), int(self.use_prev_reward), width, windowed=False
            ),
        )

    def initial_state(self, batch: int) -> list[torch.Tensor]:
        """Zero ``[h, c]``, each ``(B, cell)``."""
        return [torch.zeros(batch, self.cell_size), torch.zeros(batch, self.cell_size)]

    def _lstm_input(
        self,
        obs: torch.Tensor,
        prev_actions: torch.Tensor | None,
        prev_rewards: torch.Tensor | None,
    ) -> torch.Tensor:
        """obs ``(N, *obs)``, prev_actions ``(N, A)``, prev_rewards ``(N,)`` -> ``(N, in_size)``."""
        parts = [base_features(self.base, obs)]
        rows = parts[0].shape[0]
        if self.action_encoder is not None:
            parts.append(self.action_encoder(prev_actions).reshape(rows, -1))
        if self.use_prev_reward:
            assert prev_rewards is not None  # the signature lists prev_rewards as an input
            parts.append(prev_rewards.to(torch.float32).reshape(rows, 1))
        return torch.cat(parts, dim=1)

    def _split_prev(
        self, prev: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        expected = int(self.use_prev_action) + int(self.use_prev_reward)
        if len(prev) != expected:
            raise ValueError(
                f"LSTMWrapper: expected {expected} prev action/reward inputs, received {len(prev)}"
            )
        actions = prev[0] if self.use_prev_action else None
        rewards = prev[-1] if self.use_prev_reward else None
        return actions, rewards

    def forward(
        self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor, *prev: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        x = self._lstm_input(obs, *self._split_prev(prev))
        out, (h_n, c_n) = self.lstm(x[:, None], (h[None], c[None]))
        features = out[:, 0]
        logits = self._logits_branch(features)
        value = self._value_branch(features).reshape(-1)
        return logits, value, h_n[0], c_n[0]

    def forward_sequence(
        self,
        obs: torch.Tensor,
        h0: torch.Tensor,
        c0: torch.Tensor,
        prev_actions: torch.Tensor | None = None,
        prev_rewards: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """RLlib's training layout: obs ``(B, T, *obs)``, prev ``(B, T, A)`` / ``(B, T)``
        -> (dist_inputs ``(B, T, n)``, value ``(B, T)``, h ``(B, C)``, c ``(B, C)``)."""
        b, t = obs.shape[:2]
        flat_actions = prev_actions.reshape(b * t, -1) if prev_actions is not None else None
        flat_rewards = prev_rewards.reshape(b * t) if prev_rewards is not None else None
        x = self._lstm_input(obs.reshape(b * t, *obs.shape[2:]), flat_actions, flat_rewards)
        out, (h_n, c_n) = self.lstm(x.reshape(b, t, -1), (h0[None], c0[None]))
        logits = self._logits_branch(out)
        value = self._value_branch(out).reshape(b, t)
        return logits, value, h_n[0], c_n[0]
