"""The new stack's torch building blocks (``ray/rllib/core/models/torch``), key for key.

- ``TorchMLP`` (``mlp.<i>``): Linear, [LayerNorm(eps=0.001)], activation per hidden layer;
  then an optional output Linear, [LayerNorm], [output activation]. So without LayerNorms the
  Linear layers sit at 0, 2, 4, ..., with them at 0, 3, 6, ...
- ``TorchCNN`` (``cnn.<j>``): per ``conv_filters`` entry ``[out, kernel, stride(, padding)]``:
  ZeroPad2d (TF-"same" padding, odd pixel right/bottom; none for "valid"), Conv2d,
  activation. Input NHWC, permuted to NCHW for the convs and back to NHWC after them.
- ``MLPHead``: a ``TorchMLP`` under ``net`` and the buffer ``log_std_clip_param_const``;
  a head feeding a diagonal Gaussian clamps its log_std half to +-that constant.
- ``FreeLogStdMLPHead``: the means from ``net``, a state-independent ``log_std`` parameter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from rlserve.models.networks.common import activation_class, same_padding, valid_conv_size

__all__ = ["FreeLogStdMLPHead", "MLPHead", "TorchCNN", "TorchMLP", "conv_output_shape"]


def _activation(name: Any, where: str) -> type[nn.Module] | None:
    try:
        return activation_class(name)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


class TorchMLP(nn.Module):
    def __init__(self, input_dim: int, hidden_dims: Sequence[int], hidden_activation: Any = "relu",
                 hidden_layernorm: bool = False, output_dim: int | None = None,
                 output_activation: Any = "linear", output_layernorm: bool = False):
        super().__init__()
        hidden_act = _activation(hidden_activation, "hidden activation")
        out_act = _activation(output_activation, "output activation")
        dims = [int(input_dim), *(int(d) for d in hidden_dims), *([int(output_dim)] if output_dim else [])]
        layers: list[nn.Module] = []
        for i in range(len(dims) - 1):
            is_output = output_dim is not None and i == len(dims) - 2
            layers.append(nn.Linear(dims[i], dims[i + 1]))
            if not is_output:
                if hidden_layernorm:
                    layers.append(nn.LayerNorm(dims[i + 1], eps=0.001))
                if hidden_act is not None:
                    layers.append(hidden_act())
            elif output_layernorm:
                layers.append(nn.LayerNorm(dims[i + 1], eps=0.001))
        if output_dim is not None and out_act is not None:
            layers.append(out_act())
        self.mlp = nn.Sequential(*layers)
        self.output_dim = dims[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x)


def _filter_spec(spec: Sequence[Any], where: str) -> tuple[int, Any, Any, str]:
    if len(spec) == 3:
        out, kernel, stride = spec
        padding = "same"
    elif len(spec) == 4:
        out, kernel, stride, padding = spec
    else:
        raise ValueError(f"{where}: expected [out_channels, kernel, stride(, padding)], got {list(spec)}")
    if padding not in ("same", "valid"):
        raise ValueError(f"{where}: padding must be 'same' or 'valid', got {padding!r}")
    return int(out), kernel, stride, padding


def conv_output_shape(input_shape: Sequence[int], filters: Sequence[Sequence[Any]]) -> tuple[int, int, int]:
    """(H, W, C) after RLlib's conv stack (``CNNEncoderConfig.output_dims`` before flattening)."""
    size, depth = (int(input_shape[0]), int(input_shape[1])), int(input_shape[2])
    for i, spec in enumerate(filters):
        out, kernel, stride, padding = _filter_spec(spec, f"conv_filters[{i}]")
        size = same_padding(size, kernel, stride)[1] if padding == "same" else valid_conv_size(size, kernel, stride)
        depth = out
    return size[0], size[1], depth


class TorchCNN(nn.Module):
    def __init__(self, input_shape: Sequence[int], filters: Sequence[Sequence[Any]], activation: Any = "relu"):
        super().__init__()
        act = _activation(activation, "conv_activation")
        size, depth = (int(input_shape[0]), int(input_shape[1])), int(input_shape[2])
        layers: list[nn.Module] = []
        for i, spec in enumerate(filters):
            out, kernel, stride, padding = _filter_spec(spec, f"conv_filters[{i}]")
            if padding == "same":
                pads, size = same_padding(size, kernel, stride)
                layers.append(nn.ZeroPad2d(pads))
            else:
                size = valid_conv_size(size, kernel, stride)
            layers.append(nn.Conv2d(depth, out, _pair(kernel), _pair(stride)))
            if act is not None:
                layers.append(act())
            depth = out
        self.cnn = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cnn(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


def _pair(value: Any) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    first, second = value
    return int(first), int(second)


class MLPHead(nn.Module):
    """``net`` (hidden layers + linear output), clamping a DiagGaussian's log_std half."""

    log_std_clip_param_const: torch.Tensor

    def __init__(self, input_dim: int, hidden_dims: Sequence[int], activation: Any, layernorm: bool,
                 output_dim: int, clip_log_std: bool = False, log_std_clip_param: float = 20.0):
        super().__init__()
        self.net = TorchMLP(input_dim, hidden_dims, activation, layernorm, output_dim, "linear")
        self.clip_log_std = bool(clip_log_std)
        # A buffer in RLlib's state dict; loading the checkpoint sets the value actually used.
        self.register_buffer("log_std_clip_param_const", torch.tensor([float(log_std_clip_param)]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        if not self.clip_log_std:
            return out
        means, log_stds = torch.chunk(out, 2, dim=-1)
        bound = self.log_std_clip_param_const
        return torch.cat((means, torch.clamp(log_stds, -bound, bound)), dim=-1)


class FreeLogStdMLPHead(nn.Module):
    """Means from ``net``; ``log_std`` is a parameter, clamped and tiled over the batch."""

    log_std_clip_param_const: torch.Tensor

    def __init__(self, input_dim: int, hidden_dims: Sequence[int], activation: Any, layernorm: bool,
                 output_dim: int, clip_log_std: bool = True, log_std_clip_param: float = 20.0):
        super().__init__()
        if output_dim % 2:
            raise ValueError(f"free_log_std needs an even number of dist inputs, got {output_dim}")
        half = output_dim // 2
        self.net = TorchMLP(input_dim, hidden_dims, activation, layernorm, half, "linear")
        self.log_std = nn.Parameter(torch.zeros(half))
        self.clip_log_std = bool(clip_log_std)
        self.register_buffer("log_std_clip_param_const", torch.tensor([float(log_std_clip_param)]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = self.net(x)
        log_std: torch.Tensor = self.log_std
        if self.clip_log_std:
            bound = self.log_std_clip_param_const
            log_std = torch.clamp(log_std, -bound, bound)
        # expand (not repeat with a Python length) keeps the batch axis symbolic for export.
        return torch.cat([mean, log_std.unsqueeze(0).expand(mean.shape[0], -1)], dim=1)
