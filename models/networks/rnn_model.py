"""RLlib's example ``TorchRNNModel`` (``examples/_old_api_stack/models/rnn_model.py``).

    obs (flat) -> relu(fc1) -> nn.LSTM(batch_first) -> action_branch (logits)
                                                    -> value_branch (value)

Parameter names are RLlib's (``fc1``, ``lstm``, ``action_branch``, ``value_branch``, all
plain ``nn.Linear``/``nn.LSTM`` with torch's default init), so RLlib's weights load as
they are. Custom config: ``fc_size`` (64) and ``lstm_state_size`` (256). State ``[h, c]``,
zeros at an episode start. Unlike the LSTM wrapper it reads no previous action or reward.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from rlserve.models.networks.custom_policy import RecurrentCustomModel
from rlserve.models.networks.wrapper_inputs import positive_int

RLLIB_PATHS = (
    "ray.rllib.examples._old_api_stack.models.rnn_model.TorchRNNModel",
    "ray.rllib.examples.models.rnn_model.TorchRNNModel",
)


class TorchRNNModel(RecurrentCustomModel):
    rllib_class_name = "TorchRNNModel"

    def __init__(
        self,
        obs_space: Any,
        action_space: Any,
        num_outputs: int | None,
        model_config: Mapping[str, Any],
        name: str = "rnn_model",
        fc_size: int = 64,
        lstm_state_size: int = 256,
        **unused: Any,
    ) -> None:
        super().__init__()
        if not num_outputs:
            raise ValueError("TorchRNNModel: needs num_outputs (it cannot be wrapped by use_lstm/use_attention)")
        sizes = {"fc_size": fc_size, "lstm_state_size": lstm_state_size}
        for key in sizes:
            positive_int(sizes, key, "model_config.custom_model_config")
        self.obs_shape = tuple(int(d) for d in obs_space.shape)
        self.num_outputs = int(num_outputs)
        self.lstm_state_size = lstm_state_size
        obs_size = int(np.prod(self.obs_shape))
        self.fc1 = nn.Linear(obs_size, fc_size)
        self.lstm = nn.LSTM(fc_size, lstm_state_size, batch_first=True)
        self.action_branch = nn.Linear(lstm_state_size, self.num_outputs)
        self.value_branch = nn.Linear(lstm_state_size, 1)

    def initial_state(self) -> list[np.ndarray]:
        return [np.zeros(self.lstm_state_size, np.float32), np.zeros(self.lstm_state_size, np.float32)]

    def forward_step(
        self, obs: torch.Tensor, state: list[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """obs ``(B, *obs)``, state ``[h (B, H), c (B, H)]`` -> logits ``(B, n)``, value ``(B,)``, ``[h, c]``."""
        x = torch.relu(self.fc1(obs.reshape(obs.shape[0], -1).float()))
        features, (h, c) = self.lstm(x[:, None], (state[0][None], state[1][None]))
        features = features[:, 0]
        return self.action_branch(features), self.value_branch(features).reshape(-1), [h[0], c[0]]
