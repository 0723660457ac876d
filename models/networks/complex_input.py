"""RLlib's torch ``ComplexInputNetwork``: one sub-model per flattened observation component.

    flat obs -> slice per component -> image: VisionNetwork(num_outputs=None)
                                       Discrete/MultiDiscrete (already one-hot): FCNet
                                       anything else: FCNet on the flattened values
             -> concat (component order) -> post_fc_stack (FCNet) -> logits_layer / value_layer

RLlib registers every sub-model twice (``cnns.0`` and ``cnn_0``); here each is registered
once and ``rllib_aliases`` tells the weight importer the second name. Sub-models are built
from partial configs without ``vf_share_layers``, so (as in RLlib) they carry unused
separate value towers, kept only so that RLlib's weights load key for key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium.spaces as gs
import numpy as np
import torch
from torch import nn

from rlserve.models.networks.common import SlimFC, flat_size, normc_initializer
from rlserve.models.networks.fcnet import FullyConnectedNetwork, obs_shape_of
from rlserve.models.networks.visionnet import VisionNetwork
from rlserve.models.preprocessors import get_preprocessor

IMAGE, ONE_HOT, FLATTEN = "image", "one_hot", "flatten"
# ModuleDict attribute and RLlib's alias stem per component kind.
_REGISTRY = {IMAGE: ("cnns", "cnn"), ONE_HOT: ("one_hot", "one_hot"), FLATTEN: ("flatten", "flatten")}


@dataclass(frozen=True)
class Component:
    """Where one leaf of the original space sits in the flat observation row."""

    kind: str  # IMAGE, ONE_HOT or FLATTEN
    offset: int
    shape: tuple[int, ...]  # the leaf's shape as the preprocessor emits it

    @property
    def size(self) -> int:
        return flat_size(self.shape)


def component_kind(leaf_space: gs.Space) -> str:
    """RLlib's rule: a 3-D Box is an image, Discrete/MultiDiscrete are one-hot, the rest flat."""
    if isinstance(leaf_space, gs.Box) and len(leaf_space.shape) == 3:
        return IMAGE
    if isinstance(leaf_space, gs.Discrete | gs.MultiDiscrete):
        return ONE_HOT
    return FLATTEN


LeafShape = Callable[[gs.Space], Sequence[int]]


def plain_leaf_shape(space: gs.Space) -> tuple[int, ...]:
    """Preprocessed shape of a leaf that needs no preprocessor beyond one-hot/flatten."""
    if isinstance(space, gs.Discrete):
        return (int(space.n),)
    if isinstance(space, gs.MultiDiscrete):
        return (int(np.sum(space.nvec)),)
    if isinstance(space, gs.Box | gs.MultiBinary):
        return tuple(int(d) for d in space.shape)
    raise ValueError(
        f"ComplexInputNetwork: cannot infer the flat layout of a {type(space).__name__} leaf; "
        "build it through rlserve.models.catalog.build_model (which passes the preprocessor's shapes)"
    )


def _leaves(space: gs.Space, path: tuple, offset: int, leaf_shape: LeafShape) -> tuple[list, int]:
    """[(path, leaf space, offset, shape)] with offsets in the preprocessor's writing order."""
    children: list[tuple[int | str, gs.Space]]
    if isinstance(space, gs.Tuple):
        children = list(enumerate(space.spaces))
    elif isinstance(space, gs.Dict):
        children = list(space.spaces.items())
    else:
        shape = tuple(int(d) for d in leaf_shape(space))
        return [(path, space, offset, shape)], offset + flat_size(shape)
    found = []
    for key, child in children:
        child_leaves, offset = _leaves(child, (*path, key), offset, leaf_shape)
        found += child_leaves
    return found, offset


def components_for(original_space: gs.Space, leaf_shape: LeafShape = plain_leaf_shape) -> list[Component]:
    """Components in RLlib's order: ``flatten_space`` / dm-tree visit Dict keys *sorted*, while
    the preprocessor writes them in the space's own order, so offsets need not be increasing."""
    leaves, _ = _leaves(original_space, (), 0, leaf_shape)
    leaves.sort(key=lambda leaf: leaf[0])
    return [Component(component_kind(space), offset, shape) for _, space, offset, shape in leaves]


def leaf_slices(
    original_space: gs.Space, leaf_shape: LeafShape = plain_leaf_shape
) -> dict[tuple, tuple[int, tuple[int, ...]]]:
    """Leaf path (Dict keys / Tuple indices) -> (offset, preprocessed shape) in the flat row."""
    leaves, _ = _leaves(original_space, (), 0, leaf_shape)
    return {path: (offset, shape) for path, _, offset, shape in leaves}


def preprocessor_leaf_shape(model_config: Mapping[str, Any]) -> LeafShape:
    """Leaf shape as the catalog's preprocessor emits it (one-hot, Atari pixels, Repeated...)."""

    def shape(space: gs.Space) -> tuple[int, ...]:
        return tuple(int(d) for d in get_preprocessor(space, model_config).output_shape)

    return shape


def default_components(obs_space: Any) -> list[Component]:
    """Layout without a preprocessor: leaves of ``obs_space.original_space`` (or the space itself)."""
    return components_for(getattr(obs_space, "original_space", obs_space))


def _sub_model(component: Component, config: Mapping[str, Any]) -> VisionNetwork | FullyConnectedNetwork:
    sub: dict[str, Any]
    if component.kind == IMAGE:
        # RLlib hands the sub-net only these keys; vf_share_layers is absent on purpose.
        sub = {
            "conv_filters": config.get("conv_filters"),
            "conv_activation": config.get("conv_activation"),
            "post_fcnet_hiddens": [],
        }
        return VisionNetwork(component.shape, None, sub)
    sub = {
        "fcnet_hiddens": config.get("fcnet_hiddens"),
        "fcnet_activation": config.get("fcnet_activation"),
        "post_fcnet_hiddens": [],
    }
    return FullyConnectedNetwork(component.size, None, sub)


class ComplexInputNetwork(nn.Module):
    """Base-model contract (see ``fcnet.py``) over a flat obs made of several components."""

    def __init__(
        self,
        obs_space: Any,
        num_outputs: int | None,
        model_config: Mapping[str, Any],
        components: Sequence[Component] | None = None,
    ):
        super().__init__()
        self.obs_shape = obs_shape_of(obs_space)
        self.components = list(components) if components is not None else default_components(obs_space)
        _check_layout(self.components, flat_size(self.obs_shape))
        self.cnns, self.one_hot, self.flatten = nn.ModuleDict(), nn.ModuleDict(), nn.ModuleDict()
        self.rllib_aliases: dict[str, tuple[str, ...]] = {}
        concat_size = 0
        for i, component in enumerate(self.components):
            attr, alias_stem = _REGISTRY[component.kind]
            sub = _sub_model(component, model_config)
            getattr(self, attr)[str(i)] = sub
            self.rllib_aliases[f"{attr}.{i}."] = (f"{alias_stem}_{i}.",)
            concat_size += sub.num_outputs
        post_config = {
            "fcnet_hiddens": model_config.get("post_fcnet_hiddens") or [],
            "fcnet_activation": model_config.get("post_fcnet_activation", "relu"),
        }
        self.post_fc_stack = FullyConnectedNetwork(concat_size, None, post_config)
        width = self.post_fc_stack.num_outputs
        self.logits_layer: SlimFC | None = None
        self.value_layer: SlimFC | None = None
        if num_outputs:
            self.logits_layer = SlimFC(width, num_outputs, normc_initializer(0.01), None)
            self.value_layer = SlimFC(width, 1, normc_initializer(0.01), None)
        # RLlib reports concat_size here even when a post-FC stack changes the width, which
        # breaks LSTM/attention wrapping; the real output width is what wrappers need.
        self.num_outputs = int(num_outputs) if num_outputs else width

    def _sub(self, i: int) -> VisionNetwork | FullyConnectedNetwork:
        attr, _ = _REGISTRY[self.components[i].kind]
        return getattr(self, attr)[str(i)]

    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        flat = obs.reshape(obs.shape[0], -1)
        outs = []
        for i, c in enumerate(self.components):
            part = flat[:, c.offset : c.offset + c.size].reshape((flat.shape[0], *c.shape))
            outs.append(self._sub(i).forward_out(part))
        return self.post_fc_stack.forward_out(torch.cat(outs, dim=1))

    def forward_out(self, obs: torch.Tensor) -> torch.Tensor:
        """Only the model output (B, num_outputs); for callers that discard the value."""
        features = self._features(obs)
        return self.logits_layer(features) if self.logits_layer is not None else features

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self._features(obs)
        if self.logits_layer is None or self.value_layer is None:  # both or neither
            # Without heads RLlib's value_function() returns None; wrappers never read it.
            return features, features.new_full((features.shape[0],), float("nan"))
        return self.logits_layer(features), self.value_layer(features).reshape(-1)


def _check_layout(components: Sequence[Component], obs_size: int) -> None:
    end = max((c.offset + c.size for c in components), default=0)
    if not components or end > obs_size:
        raise ValueError(
            f"ComplexInputNetwork: components cover {end} values but the observation has {obs_size}"
        )
