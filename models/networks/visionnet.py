"""Convolutional network, numerically and key-for-key RLlib's torch ``VisionNetwork``.

Input is NHWC (as the preprocessor emits it) and is permuted to NCHW. Every conv but the
last uses emulated TF-"same" padding; the last is "valid" and must leave a 1x1 map whenever
the network has a head (RLlib fails at forward time; here the constructor says which
``conv_filters`` would work). Base-model contract: see ``models/networks/fcnet.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from rlserve.models.conv_filters import default_conv_filters
from rlserve.models.networks.common import (
    SlimConv2d,
    SlimFC,
    normc_initializer,
    same_padding,
    valid_conv_size,
)
from rlserve.models.networks.fcnet import obs_shape_of

Filter = tuple[int, Any, Any]  # (out_channels, kernel, stride); kernel/stride an int or [h, w]

def _parse_filters(filters: Any) -> list[Filter]:
    parsed = []
    for entry in filters:
        if not isinstance(entry, Sequence) or len(entry) != 3:
            raise ValueError(f"conv_filters: each entry must be [out_channels, kernel, stride], got {entry!r}")
        parsed.append((int(entry[0]), entry[1], entry[2]))
    if not parsed:
        raise ValueError("conv_filters: at least one [out_channels, kernel, stride] entry is needed")
    return parsed


def _conv_stack(in_hw: tuple[int, int], channels: int, filters: list[Filter], activation: Any):
    """Same-padded convs for all but the last filter, then the valid last conv.

    Returns (layers, map size before the last conv, map size after it).
    """
    layers: list[nn.Module] = []
    size = in_hw
    for out_channels, kernel, stride in filters[:-1]:
        padding, size = same_padding(size, kernel, stride)
        layers.append(SlimConv2d(channels, out_channels, kernel, stride, padding, activation))
        channels = out_channels
    before_last = size
    out_channels, kernel, stride = filters[-1]
    layers.append(SlimConv2d(channels, out_channels, kernel, stride, None, activation))
    return layers, before_last, valid_conv_size(size, kernel, stride)


class VisionNetwork(nn.Module):
    """Conv stack with a 1x1-conv (or post-FC) logits head and a shared or separate value head."""

    def __init__(self, obs_space: Any, num_outputs: int | None, model_config: Mapping[str, Any]):
        super().__init__()
        self.obs_shape = obs_shape_of(obs_space)
        if len(self.obs_shape) != 3:
            raise ValueError(f"VisionNetwork needs an (H, W, C) observation, got shape {list(self.obs_shape)}")
        raw_filters = model_config.get("conv_filters") or default_conv_filters(self.obs_shape)
        self.conv_filters = [list(f) for f in raw_filters]
        filters = _parse_filters(raw_filters)
        activation = model_config.get("conv_activation")
        post = [int(h) for h in (model_config.get("post_fcnet_hiddens") or [])]
        no_final_linear = bool(model_config.get("no_final_linear"))
        vf_share = bool(model_config.get("vf_share_layers"))
        _check_head_options(num_outputs, post, no_final_linear, vf_share)
        height, width, channels = self.obs_shape

        if no_final_linear and num_outputs:
            # The last conv itself has num_outputs channels and keeps its activation.
            filters = [*filters[:-1], (int(num_outputs), filters[-1][1], filters[-1][2])]
        layers, before_last, self.final_map = _conv_stack((height, width), channels, filters, activation)
        last_channels = filters[-1][0]
        self._logits: nn.Module | None = None
        self._flattened = not num_outputs
        if num_outputs:
            _require_1x1(self.conv_filters, (height, width), before_last, self.final_map, num_outputs)
            if no_final_linear:
                pass  # the last conv already has num_outputs channels
            elif post:
                layers.append(nn.Flatten())
                layers += _post_fc_layers(last_channels, post, num_outputs, model_config)
                self._logits = layers.pop()
            else:
                self._logits = SlimConv2d(last_channels, num_outputs, 1, 1, (0, 0, 0, 0), None)
            self.num_outputs = int(num_outputs)
        else:
            layers.append(nn.Flatten())
            self.num_outputs = last_channels * self.final_map[0] * self.final_map[1]
        self._convs = nn.Sequential(*layers)
        self._value_has_1x1 = self.final_map == (1, 1)
        self._value_branch: SlimFC | None = None
        self._value_branch_separate: nn.Sequential | None = None
        if vf_share:
            self._value_branch = SlimFC(last_channels, 1, normc_initializer(0.01), None)
        else:
            # The separate tower repeats the configured stack (no num_outputs override), then 1x1 -> 1.
            configured = _parse_filters(raw_filters)
            value_layers, _, _ = _conv_stack((height, width), channels, configured, activation)
            value_layers.append(SlimConv2d(configured[-1][0], 1, 1, 1, None, None))
            self._value_branch_separate = nn.Sequential(*value_layers)

    def forward_out(self, obs: torch.Tensor) -> torch.Tensor:
        """Only the model output (B, num_outputs); for callers that discard the value."""
        return self._head(self._convs(self._nchw(obs)))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self._nchw(obs)
        conv_out = self._convs(x)
        return self._head(conv_out), self._value(x, conv_out)

    @staticmethod
    def _nchw(obs: torch.Tensor) -> torch.Tensor:
        return obs.float().permute(0, 3, 1, 2)

    def _head(self, conv_out: torch.Tensor) -> torch.Tensor:
        if self._logits is not None:
            conv_out = self._logits(conv_out)
        # A 1x1 map was checked at construction, so flattening equals RLlib's squeeze(3).squeeze(2).
        return conv_out.flatten(1)

    def _value(self, x: torch.Tensor, conv_out: torch.Tensor) -> torch.Tensor:
        if not self._value_has_1x1:
            # Only reachable without a head (num_outputs=None): RLlib's value_function() fails
            # here; the wrappers and ComplexInputNetwork never read it.
            return x.new_full((x.shape[0],), float("nan"))
        if self._value_branch_separate is not None:
            return self._value_branch_separate(x).flatten(1).squeeze(1)
        assert self._value_branch is not None  # built whenever the separate branch is not
        return self._value_branch(conv_out.flatten(1)).squeeze(1)


def _post_fc_layers(in_size: int, post: list[int], num_outputs: int, config: Mapping[str, Any]) -> list[SlimFC]:
    """post_fcnet_hiddens + [num_outputs]; only the first len(post)-1 get the activation (as RLlib)."""
    activation = config.get("post_fcnet_activation")
    layers = []
    for i, size in enumerate([*post, int(num_outputs)]):
        act = activation if i < len(post) - 1 else None
        layers.append(SlimFC(in_size, size, normc_initializer(1.0), act))
        in_size = size
    return layers


def _check_head_options(num_outputs: int | None, post: list[int], no_final_linear: bool, vf_share: bool) -> None:
    """Configs RLlib builds but then crashes on (SKIPPED.md) fail here with the reason."""
    if not num_outputs or not post:
        return
    if no_final_linear:
        raise ValueError(
            "VisionNetwork: no_final_linear=True cannot be combined with post_fcnet_hiddens "
            "(RLlib applies the post-FC layers to the un-flattened conv output and fails); "
            "drop one of the two"
        )
    if vf_share:
        raise ValueError(
            "VisionNetwork: post_fcnet_hiddens with vf_share_layers=True has no working value head "
            "in RLlib (value_function() fails on the flattened features); set vf_share_layers=False"
        )


def _require_1x1(filters: list[list[Any]], in_hw: tuple[int, int], before_last: tuple[int, int],
                 final_map: tuple[int, int], num_outputs: int) -> None:
    if final_map == (1, 1):
        return
    out_channels, _, _ = filters[-1]
    suggestion = [*filters[:-1], [out_channels, [before_last[0], before_last[1]], 1]]
    raise ValueError(
        f"conv_filters {filters} turn the {in_hw[0]}x{in_hw[1]} input into a "
        f"{final_map[0]}x{final_map[1]} map after the last (valid) conv, but VisionNetwork needs "
        f"[B, {num_outputs} (num_outputs), 1, 1]. The layers before the last leave a "
        f"{before_last[0]}x{before_last[1]} map, so e.g. conv_filters={suggestion} would work "
        f"(last kernel = that map, stride 1)"
    )

