"""RLlib's example ``TorchParametricActionsModel`` (``examples/_old_api_stack/models/parametric_actions_model.py``).

The seeds' "Variable-length / Parametric Action Spaces": the observation is a Dict with

- ``avail_actions`` (N, E): one embedding per action slot,
- ``action_mask`` (N,): 1 for the slots valid at this step, 0 for the others,
- ``cart``: the real observation,

and the logits are ``sum(avail_actions * intent, axis=2) + clamp(log(action_mask),
FLOAT_MIN, FLOAT_MAX)`` where ``intent`` (B, E) is an FCNet (``action_embed_model``, the
model config's ``fcnet_*``) of ``cart``; the value is that FCNet's value. A masked slot's
logit is ``logit + FLOAT_MIN``, i.e. FLOAT_MIN in float32, not -inf.

RLlib's class derives from ``DQNTorchModel``, whose constructor builds the DQN Q-heads
(``advantage_module`` and, when ``dueling``, ``value_module``; sizes from the custom config's
``q_hiddens``, ``dueling``, ``dueling_activation``, ``num_atoms``, ``add_layer_norm``) even
though ``forward`` never uses them. They are built here too, unused, so that RLlib's
weights load key for key. Custom config: ``true_obs_shape`` ((4,)), ``action_embed_size``
(2), plus those Q-head options.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium.spaces as gs
import torch
from torch import nn

from rlserve.models.networks.action_mask import FLOAT_MIN
from rlserve.models.networks.common import SlimFC, flat_size
from rlserve.models.networks.complex_input import leaf_slices, preprocessor_leaf_shape
from rlserve.models.networks.fcnet import FullyConnectedNetwork

FLOAT_MAX = 3.4e38
RLLIB_PATHS = (
    "ray.rllib.examples._old_api_stack.models.parametric_actions_model.TorchParametricActionsModel",
    "ray.rllib.examples.models.parametric_actions_model.TorchParametricActionsModel",
)
KEYS = ("action_mask", "avail_actions", "cart")


def _q_heads(ins: int, n_actions: int, q_hiddens: Sequence[int], dueling: bool, activation: str,
             num_atoms: int, add_layer_norm: bool) -> tuple[nn.Sequential, nn.Sequential | None]:
    """DQNTorchModel's advantage (and dueling value) modules, with its layer names."""
    advantage, value = nn.Sequential(), nn.Sequential()
    for i, size in enumerate(q_hiddens):
        advantage.add_module(f"dueling_A_{i}", SlimFC(ins, size, activation=activation))
        value.add_module(f"dueling_V_{i}", SlimFC(ins, size, activation=activation))
        if add_layer_norm:
            advantage.add_module(f"LayerNorm_A_{i}", nn.LayerNorm(size))
            value.add_module(f"LayerNorm_V_{i}", nn.LayerNorm(size))
        ins = size
    if q_hiddens:
        advantage.add_module("A", SlimFC(ins, n_actions * num_atoms))
        value.add_module("V", SlimFC(ins, num_atoms))
    return advantage, (value if dueling else None)


class TorchParametricActionsModel(nn.Module):
    """Base-model contract (``forward(obs) -> (masked logits, value)``) over the flat Dict obs."""

    rllib_class_name = "TorchParametricActionsModel"

    def __init__(
        self,
        obs_space: Any,
        action_space: gs.Space,
        num_outputs: int | None,
        model_config: Mapping[str, Any],
        name: str = "parametric_actions",
        true_obs_shape: Sequence[int] = (4,),
        action_embed_size: int = 2,
        q_hiddens: Sequence[int] = (256,),
        dueling: bool = False,
        dueling_activation: str = "relu",
        num_atoms: int = 1,
        use_noisy: bool = False,
        add_layer_norm: bool = False,
        **unused: Any,
    ) -> None:
        super().__init__()
        original = getattr(obs_space, "original_space", obs_space)
        if not isinstance(original, gs.Dict) or any(k not in original.spaces for k in KEYS):
            raise ValueError(
                f"parametric-actions model: expected a Dict observation space with keys {list(KEYS)}, "
                f"got {original}"
            )
        if not isinstance(action_space, gs.Discrete) or not num_outputs:
            raise ValueError(
                f"parametric-actions model: expected a Discrete action space and num_outputs, got "
                f"{action_space} and {num_outputs!r}"
            )
        if use_noisy:
            raise ValueError("model_config.custom_model_config.use_noisy: noisy Q-heads are not supported, "
                             "expected false, received true")
        self.num_outputs = int(num_outputs)
        self.obs_shape = tuple(int(d) for d in getattr(obs_space, "shape", ()) or ())
        slices = leaf_slices(original, preprocessor_leaf_shape(model_config))
        (self.mask_offset, mask_shape), (self.avail_offset, self.avail_shape), (self.cart_offset, cart_shape) = (
            slices[(k,)] for k in KEYS)
        self.cart_size = flat_size(cart_shape)
        expected = {"action_mask": ((self.num_outputs,), "(num_outputs,)"),
                    "avail_actions": ((self.num_outputs, int(action_embed_size)), "(num_outputs, action_embed_size)")}
        for key, shape in (("action_mask", mask_shape), ("avail_actions", self.avail_shape)):
            want, meaning = expected[key]
            if tuple(shape) != want:
                raise ValueError(
                    f"parametric-actions model: observation {key!r} must have shape {list(want)} {meaning}, "
                    f"received {list(shape)}"
                )
        self.true_obs_shape = tuple(int(d) for d in true_obs_shape)
        if flat_size(self.true_obs_shape) != self.cart_size:
            raise ValueError(
                f"model_config.custom_model_config.true_obs_shape: expected {self.cart_size} values in all "
                f"(the 'cart' observation), received {list(self.true_obs_shape)}"
            )
        self.action_embed_model = FullyConnectedNetwork(self.true_obs_shape, int(action_embed_size), model_config)
        self.advantage_module, value_module = _q_heads(
            self.num_outputs, action_space.n, [int(h) for h in q_hiddens], bool(dueling), dueling_activation,
            int(num_atoms), bool(add_layer_norm))
        if value_module is not None:
            self.value_module = value_module

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = obs.reshape(obs.shape[0], -1).float()
        n = self.num_outputs
        mask = flat[:, self.mask_offset : self.mask_offset + n]
        avail = flat[:, self.avail_offset : self.avail_offset + flat_size(self.avail_shape)]
        cart = flat[:, self.cart_offset : self.cart_offset + self.cart_size]
        intent, value = self.action_embed_model(cart.reshape((flat.shape[0], *self.true_obs_shape)))
        logits = (avail.reshape(flat.shape[0], *self.avail_shape) * intent[:, None]).sum(dim=2)
        return logits + torch.clamp(torch.log(mask), FLOAT_MIN, FLOAT_MAX), value
