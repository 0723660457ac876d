"""Building blocks shared by the feedforward networks (RLlib's torch ``misc.py`` counterparts).

The module layout (``_model`` Sequential inside every layer, a ``ZeroPad2d`` at index 0 of
padded convolutions) mirrors RLlib so that its ``state_dict`` keys load without renaming.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
import torch
from torch import nn

Initializer = Callable[[torch.Tensor], object]

# Names RLlib resolves by hand (lower-cased) once ``getattr(torch.nn, name)`` found nothing.
_NAMED_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "swish": nn.SiLU,
    "silu": nn.SiLU,
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "elu": nn.ELU,
}


def activation_class(name: str | type[nn.Module] | None) -> type[nn.Module] | None:
    """Activation module class for a config value; ``None`` means no activation.

    Accepts "relu", "tanh", "elu", "swish"/"silu", "linear"/None (case-insensitive) and,
    like RLlib, any ``torch.nn`` class name such as "GELU" or "LeakyReLU".
    """
    if name is None or (isinstance(name, type) and issubclass(name, nn.Module)):
        return name
    if not isinstance(name, str):
        raise ValueError(f"activation: expected a string or None, got {name!r}")
    if name.lower() == "linear":
        return None
    from_torch = getattr(nn, name, None)
    if isinstance(from_torch, type) and issubclass(from_torch, nn.Module):
        return from_torch
    found = _NAMED_ACTIVATIONS.get(name.lower())
    if found is None:
        valid = sorted([*_NAMED_ACTIVATIONS, "linear"])
        raise ValueError(f"unknown activation {name!r}: use one of {valid}, None, or a torch.nn class name")
    return found


def normc_initializer(std: float = 1.0) -> Initializer:
    """N(0, 1) weights with every output row rescaled to L2 norm ``std`` (RLlib's normc)."""

    def init(weight: torch.Tensor) -> None:
        with torch.no_grad():
            weight.normal_(0.0, 1.0)
            weight.mul_(std / weight.pow(2).sum(1, keepdim=True).sqrt())

    return init


class SlimFC(nn.Module):
    """Linear layer plus optional activation, stored as ``_model = Sequential(linear, act)``."""

    def __init__(
        self,
        in_size: int,
        out_size: int,
        initializer: Initializer | None = None,
        activation: str | type[nn.Module] | None = None,
        use_bias: bool = True,
        bias_init: float = 0.0,
    ):
        super().__init__()
        linear = nn.Linear(int(in_size), int(out_size), bias=use_bias)
        (initializer or nn.init.xavier_uniform_)(linear.weight)
        if use_bias:
            nn.init.constant_(linear.bias, bias_init)
        layers: list[nn.Module] = [linear]
        act = activation_class(activation)
        if act is not None:
            layers.append(act())
        self._model = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._model(x)


Padding = tuple[int, int, int, int]


class SlimConv2d(nn.Module):
    """Conv2d with optional explicit zero padding (index 0) and activation.

    ``padding=None`` means "valid" (no pad module, so the conv is ``_model.0``); any tuple,
    even all zeros, adds a ``ZeroPad2d`` so the conv is ``_model.1``, as in RLlib.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel: int | Sequence[int],
        stride: int | Sequence[int],
        padding: Padding | None,
        activation: str | type[nn.Module] | None = "relu",
        bias_init: float = 0.0,
    ):
        super().__init__()
        layers: list[nn.Module] = []
        if padding is not None:
            layers.append(nn.ZeroPad2d(padding))
        conv = nn.Conv2d(int(in_channels), int(out_channels), _pair(kernel), _pair(stride))
        nn.init.xavier_uniform_(conv.weight)
        assert conv.bias is not None  # nn.Conv2d has a bias unless bias=False
        nn.init.constant_(conv.bias, bias_init)
        layers.append(conv)
        act = activation_class(activation)
        if act is not None:
            layers.append(act())
        self._model = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._model(x)


class AppendBiasLayer(nn.Module):
    """Appends a free, state-independent parameter vector (``log_std``) to every row."""

    def __init__(self, num_bias_vars: int):
        super().__init__()
        self.log_std = nn.Parameter(torch.zeros(int(num_bias_vars)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # expand (not repeat with a Python len) keeps the batch axis symbolic for export.
        return torch.cat([x, self.log_std.unsqueeze(0).expand(x.shape[0], -1)], dim=1)


def _pair(value: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(value, int | np.integer):
        return int(value), int(value)
    first, second = value
    return int(first), int(second)


def same_padding(
    in_size: Sequence[int], kernel: int | Sequence[int], stride: int | Sequence[int]
) -> tuple[Padding, tuple[int, int]]:
    """TF-"same" padding for an (H, W) input: ``((left, right, top, bottom), (out_h, out_w))``.

    The odd pixel goes to the right/bottom, like TensorFlow and RLlib.
    """
    (in_h, in_w), (k_h, k_w), (s_h, s_w) = in_size, _pair(kernel), _pair(stride)
    out_h, out_w = math.ceil(in_h / s_h), math.ceil(in_w / s_w)
    pad_h = (out_h - 1) * s_h + k_h - in_h
    pad_w = (out_w - 1) * s_w + k_w - in_w
    return (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2), (out_h, out_w)


def valid_conv_size(
    in_size: Sequence[int], kernel: int | Sequence[int], stride: int | Sequence[int]
) -> tuple[int, int]:
    """Output (H, W) of an unpadded ("valid") convolution."""
    (in_h, in_w), (k_h, k_w), (s_h, s_w) = in_size, _pair(kernel), _pair(stride)
    return (in_h - k_h) // s_h + 1, (in_w - k_w) // s_w + 1


def flat_size(shape: Sequence[int] | None) -> int:
    """Number of elements of one row of the given shape (1 for a scalar)."""
    return int(np.prod(shape)) if shape else 1


def num_outputs_of(model: nn.Module) -> int:
    """A sub-model's ``num_outputs`` (a plain int attribute of every model here).

    torch types attributes a Module does not declare as ``Tensor | Module``, hence the cast.
    """
    return int(cast(Any, model).num_outputs)
