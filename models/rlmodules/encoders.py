"""The new stack's default encoders, chosen as RLlib's ``Catalog._get_encoder_config`` does.

    use_lstm           -> LSTMEncoder: a tokenizer (the encoder below for the same space)
                          then ``lstm`` (torch nn.LSTM, one layer, batch_first); the state
                          is ``h``, ``c``, each (num_layers=1, lstm_cell_size) per row
    1-D Box            -> MLPEncoder: ``net`` = TorchMLP(fcnet_hiddens[:-1] hidden layers,
                          output fcnet_hiddens[-1]), fcnet_activation after *every* layer,
                          LayerNorm before each activation with fcnet_use_layernorm
    3-D Box (H, W, C)  -> CNNEncoder: ``net`` = Sequential(TorchCNN(conv_filters), Flatten):
                          the maps are flattened in (h, w, c) order; no dense layer
    anything else      -> refused (RLlib has no default encoder for it either)

``conv_filters`` unset takes RLlib's defaults by image size (``rlserve.models.conv_filters``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from rlserve.models.conv_filters import default_conv_filters
from rlserve.models.rlmodules.layers import TorchCNN, TorchMLP, conv_output_shape

__all__ = ["CNNEncoder", "LSTMEncoder", "MLPEncoder", "build_encoder"]

class MLPEncoder(nn.Module):
    def __init__(self, input_dim: int, config: Mapping[str, Any]):
        super().__init__()
        hiddens = list(config["fcnet_hiddens"])
        if not hiddens:
            raise ValueError("fcnet_hiddens is empty: RLlib's MLP encoder needs at least one layer")
        act, layernorm = config["fcnet_activation"], bool(config["fcnet_use_layernorm"])
        self.net = TorchMLP(input_dim, hiddens[:-1], act, layernorm, hiddens[-1], act, layernorm)
        self.output_dim = int(hiddens[-1])

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


class CNNEncoder(nn.Module):
    def __init__(self, input_shape: Sequence[int], config: Mapping[str, Any]):
        super().__init__()
        filters = config.get("conv_filters") or default_conv_filters(input_shape)
        self.net = nn.Sequential(TorchCNN(input_shape, filters, config["conv_activation"]), nn.Flatten())
        h, w, c = conv_output_shape(input_shape, filters)
        self.output_dim = h * w * c

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


class LSTMEncoder(nn.Module):
    """One step: ``obs (B, *obs_shape), h (B, 1, H), c (B, 1, H) -> (out (B, H), h', c')``."""

    def __init__(self, obs_shape: Sequence[int], config: Mapping[str, Any]):
        super().__init__()
        self.tokenizer = _feedforward(obs_shape, config)
        self.hidden = int(config["lstm_cell_size"])
        self.lstm = nn.LSTM(self.tokenizer.output_dim, self.hidden, 1, batch_first=True)
        self.output_dim = self.hidden

    def forward(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        tokens = self.tokenizer(obs)
        # RLlib's state is (B, num_layers, H); torch's LSTM wants (num_layers, B, H).
        out, (h_n, c_n) = self.lstm(tokens[:, None], (h.transpose(0, 1), c.transpose(0, 1)))
        return out[:, 0], h_n.transpose(0, 1), c_n.transpose(0, 1)


def _feedforward(obs_shape: Sequence[int], config: Mapping[str, Any]) -> MLPEncoder | CNNEncoder:
    shape = [int(d) for d in obs_shape]
    if len(shape) == 1:
        return MLPEncoder(shape[0], config)
    if len(shape) == 3:
        return CNNEncoder(shape, config)
    raise ValueError(f"no default encoder for an observation of shape {shape}: RLlib's catalog builds one for "
                     "1-D (MLP) and 3-D (image) Box observations only; flatten it with a FlattenObservations "
                     "connector or serve a custom model")


def build_encoder(obs_shape: Sequence[int], config: Mapping[str, Any]) -> MLPEncoder | CNNEncoder | LSTMEncoder:
    """The default encoder for the module's (Box) observation shape; see the module docstring."""
    if config.get("use_lstm"):
        return LSTMEncoder(obs_shape, config)
    return _feedforward(obs_shape, config)


def is_recurrent(encoder: nn.Module) -> bool:
    return isinstance(encoder, LSTMEncoder)
