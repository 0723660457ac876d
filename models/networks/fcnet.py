"""Fully connected network, numerically and key-for-key RLlib's torch ``FullyConnectedNetwork``.

Base-model contract (shared by every network in this package, wrapped by the LSTM and
attention wrappers and by ``FeedForwardPolicy``):

    model.num_outputs: int
    model(obs (B, *obs_shape)) -> (out (B, num_outputs), value (B,))

``forward`` is pure (no stored features), so it traces and exports. Built with
``num_outputs=None`` the output is the last hidden activation and ``num_outputs`` becomes
its width, as in RLlib, which is what the wrappers build on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from rlserve.models.networks.common import (
    AppendBiasLayer,
    SlimFC,
    activation_class,
    flat_size,
    normc_initializer,
)


def obs_shape_of(obs_space_or_shape: Any) -> tuple[int, ...]:
    """Shape of one observation row from a gymnasium space, an int width or a shape tuple."""
    if isinstance(obs_space_or_shape, int):
        return (obs_space_or_shape,)
    if isinstance(obs_space_or_shape, Sequence):
        return tuple(int(d) for d in obs_space_or_shape)
    shape = getattr(obs_space_or_shape, "shape", None)
    if shape is None:
        raise ValueError(f"cannot tell the observation shape of {obs_space_or_shape!r}")
    return tuple(int(d) for d in shape)


def _dense_tower(in_size: int, sizes: Sequence[int], activation: Any) -> list[SlimFC]:
    layers = []
    for size in sizes:
        layers.append(SlimFC(in_size, size, normc_initializer(1.0), activation))
        in_size = size
    return layers


class FullyConnectedNetwork(nn.Module):
    """MLP over the flattened observation with a logits head and a (shared or separate) value head."""

    def __init__(self, obs_space: Any, num_outputs: int | None, model_config: Mapping[str, Any]):
        super().__init__()
        self.obs_shape = obs_shape_of(obs_space)
        in_size = flat_size(self.obs_shape)
        hiddens = [int(h) for h in (model_config.get("fcnet_hiddens") or [])]
        hiddens += [int(h) for h in (model_config.get("post_fcnet_hiddens") or [])]
        # RLlib reads post_fcnet_activation only when fcnet_hiddens is empty.
        act_key = "fcnet_activation" if model_config.get("fcnet_hiddens") else "post_fcnet_activation"
        activation = activation_class(model_config.get(act_key))
        no_final_linear = bool(model_config.get("no_final_linear"))
        free_log_std = bool(model_config.get("free_log_std"))
        _check_head_options(num_outputs, free_log_std, no_final_linear)
        head_size = num_outputs
        if free_log_std:
            assert num_outputs is not None  # _check_head_options rejects free_log_std without it
            head_size = num_outputs // 2

        layers = _dense_tower(in_size, hiddens[:-1], activation)
        width = hiddens[-2] if len(hiddens) > 1 else in_size
        self._logits: SlimFC | None = None
        if no_final_linear and head_size:
            # The last layer takes num_outputs units and keeps its activation; no logits layer.
            layers.append(SlimFC(width, head_size, normc_initializer(1.0), activation))
            width = head_size
        else:
            if hiddens:
                layers.append(SlimFC(width, hiddens[-1], normc_initializer(1.0), activation))
                width = hiddens[-1]
            if head_size:
                self._logits = SlimFC(width, head_size, normc_initializer(0.01), None)
        self.num_outputs = int(num_outputs) if num_outputs else width
        if free_log_std:
            assert head_size is not None
            self._append_free_log_std = AppendBiasLayer(head_size)
        self.free_log_std = free_log_std
        self._hidden_layers = nn.Sequential(*layers)

        # vf_share_layers falsy (also when absent, as in ComplexInputNetwork's sub-configs)
        # builds a separate tower; an empty tower means the value reads the features.
        self._value_branch_separate: nn.Sequential | None = None
        if not model_config.get("vf_share_layers"):
            self._value_branch_separate = nn.Sequential(*_dense_tower(in_size, hiddens, activation))
        self._uses_separate_value = bool(self._value_branch_separate is not None and hiddens)
        if self._uses_separate_value:
            _check_separate_value(hiddens[-1], width)
        self._value_branch = SlimFC(width, 1, normc_initializer(0.01), None)

    def _flat(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.float().reshape(obs.shape[0], -1)

    def _features_to_out(self, features: torch.Tensor) -> torch.Tensor:
        out = self._logits(features) if self._logits is not None else features
        if self.free_log_std:
            out = self._append_free_log_std(out)
        return out

    def forward_out(self, obs: torch.Tensor) -> torch.Tensor:
        """Only the model output (B, num_outputs); for callers that discard the value."""
        return self._features_to_out(self._hidden_layers(self._flat(obs)))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = self._flat(obs)
        features = self._hidden_layers(flat)
        if self._uses_separate_value:
            assert self._value_branch_separate is not None  # implied by _uses_separate_value
            value = self._value_branch(self._value_branch_separate(flat))
        else:
            value = self._value_branch(features)
        return self._features_to_out(features), value.squeeze(1)


def _check_head_options(num_outputs: int | None, free_log_std: bool, no_final_linear: bool) -> None:
    """Reject head options RLlib itself crashes on, with a message that says why."""
    if not free_log_std:
        return
    if not num_outputs:
        raise ValueError(
            "free_log_std=True needs a known num_outputs (it appends a log_std half to the logits); "
            "it cannot be used when the network is wrapped (use_lstm/use_attention) or has no head"
        )
    if num_outputs % 2:
        raise ValueError(f"free_log_std=True needs an even num_outputs (means + log_stds), got {num_outputs}")
    if no_final_linear:
        raise ValueError("free_log_std=True cannot be combined with no_final_linear=True (RLlib fails on it too)")


def _check_separate_value(tower_out: int, value_in: int) -> None:
    if tower_out != value_in:
        raise ValueError(
            f"no_final_linear=True with vf_share_layers=False: the value tower ends in {tower_out} units "
            f"but the value head expects {value_in} (num_outputs); RLlib fails on this at value_function(). "
            "Set vf_share_layers=True or make the last fcnet_hiddens entry equal num_outputs"
        )
