"""RLlib's example ``TorchActionMaskModel`` as a built-in custom model.

Observation: Dict with ``action_mask`` (one 0/1 per action) and ``observations``. An
internal FCNet reads ``observations``; the mask is applied as
``logits + clamp(log(mask), min=FLOAT_MIN)`` so masked logits are a finite -3.4e38, not
-inf (RLlib's choice: it keeps softmax and logp finite). The value comes from the FCNet.
Both leaves are sliced out of the flat observation at the preprocessor's offsets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium.spaces as gs
import torch
from torch import nn

from rlserve.models.networks.common import flat_size
from rlserve.models.networks.complex_input import leaf_slices, preprocessor_leaf_shape
from rlserve.models.networks.fcnet import FullyConnectedNetwork

# RLlib's FLOAT_MIN (float32 min rounded); masked logits equal this plus the raw logit.
FLOAT_MIN = -3.4e38
# Where RLlib configs name this model; all resolve to the built-in below.
RLLIB_PATHS = (
    "ray.rllib.examples._old_api_stack.models.action_mask_model.TorchActionMaskModel",
    "ray.rllib.examples.models.action_mask_model.TorchActionMaskModel",
)


def _leaf(slices: Mapping[tuple, tuple[int, tuple[int, ...]]], key: str) -> tuple[int, tuple[int, ...]]:
    found = slices.get((key,))
    if found is None:
        raise ValueError(
            f"action-mask model: the observation space must be a Dict with keys 'action_mask' and "
            f"'observations'; key {key!r} is missing"
        )
    return found


class ActionMaskModel(nn.Module):
    """Base-model contract (``forward(obs) -> (masked logits, value)``) over the flat Dict obs."""

    rllib_class_name = "TorchActionMaskModel"

    def __init__(
        self,
        obs_space: Any,
        action_space: gs.Space,
        num_outputs: int | None,
        model_config: Mapping[str, Any],
        name: str = "action_mask",
        no_masking: bool = False,
        **unused: Any,
    ):
        super().__init__()
        original = getattr(obs_space, "original_space", obs_space)
        if not isinstance(original, gs.Dict):
            raise ValueError(
                f"action-mask model: expected a Dict observation space with 'action_mask' and "
                f"'observations', got {type(original).__name__}"
            )
        if not num_outputs:
            raise ValueError(
                "action-mask model masks the final logits, so it cannot be wrapped "
                "(use_lstm/use_attention) or built without num_outputs"
            )
        slices = leaf_slices(original, preprocessor_leaf_shape(model_config))
        self.mask_offset, mask_shape = _leaf(slices, "action_mask")
        self.obs_offset, self.inner_shape = _leaf(slices, "observations")
        self.mask_size, self.inner_size = flat_size(mask_shape), flat_size(self.inner_shape)
        if self.mask_size != num_outputs:
            raise ValueError(
                f"action-mask model: action_mask has {self.mask_size} entries but the action "
                f"distribution takes {num_outputs} inputs; they must match"
            )
        self.obs_shape = tuple(int(d) for d in getattr(obs_space, "shape", ()) or ())
        self.no_masking = bool(no_masking)
        self.num_outputs = int(num_outputs)
        self.internal_model = FullyConnectedNetwork(self.inner_shape, num_outputs, model_config)

    def _split(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = obs.reshape(obs.shape[0], -1).float()
        mask = flat[:, self.mask_offset : self.mask_offset + self.mask_size]
        inner = flat[:, self.obs_offset : self.obs_offset + self.inner_size]
        return mask, inner.reshape((flat.shape[0], *self.inner_shape))

    def unmasked(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The internal FCNet's (logits, value) before masking."""
        return self.internal_model(self._split(obs)[1])

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask, inner = self._split(obs)
        logits, value = self.internal_model(inner)
        if self.no_masking:
            return logits, value
        return logits + torch.clamp(torch.log(mask), min=FLOAT_MIN), value
