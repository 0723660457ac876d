"""MultiActionDistribution: one child distribution per leaf of a Tuple/Dict action space.

Children and their input slices follow RLlib's flattened order (Tuple order, Dict keys
sorted, recursively). ``sample``/``deterministic_sample`` return the space's structure
(tuples for Tuple, dicts for Dict); ``logp`` takes that structure or one flat ``(B, A)``
row per action (RLlib's flattened action: Discrete = 1 column, MultiDiscrete = k columns,
Box = prod(shape) columns). logp and entropy are sums over the children, in order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces as gs

from ._math import F32
from .base import ActionDistribution
from .categorical import Categorical, MultiCategorical
from .structure import flatten_leaves, leaf_spaces, unflatten_leaves

__all__ = ["MultiActionDistribution"]

ChildFactory = Callable[[np.ndarray], ActionDistribution]


class MultiActionDistribution(ActionDistribution):
    rllib_name = "TorchMultiActionDistribution"

    def __init__(
        self,
        inputs: np.ndarray,
        *,
        child_distributions: Sequence[ChildFactory],
        input_lens: Sequence[int],
        action_space: gs.Space,
    ):
        super().__init__(inputs)
        self.action_space = action_space
        self.input_lens = [int(n) for n in input_lens]
        n_leaves = len(leaf_spaces(action_space))
        if not (len(child_distributions) == len(self.input_lens) == n_leaves):
            raise ValueError(
                f"MultiActionDistribution: {n_leaves} action leaves, but {len(child_distributions)} "
                f"child distributions and {len(self.input_lens)} input_lens"
            )
        if sum(self.input_lens) != self.inputs.shape[1]:
            raise ValueError(
                f"MultiActionDistribution: input_lens {self.input_lens} sum to {sum(self.input_lens)}, "
                f"but the dist inputs have {self.inputs.shape[1]} columns"
            )
        blocks = np.split(self.inputs, np.cumsum(self.input_lens)[:-1], axis=1)
        self.children = [make(block) for make, block in zip(child_distributions, blocks, strict=True)]

    @staticmethod
    def required_model_output_shape(action_space: gs.Space, model_config: dict[str, Any]) -> int:
        raise TypeError("MultiActionDistribution's size is the sum of its children's (see get_action_dist)")

    def _sample(self, rng: np.random.Generator) -> Any:
        return unflatten_leaves(self.action_space, [c.sample(rng) for c in self.children])

    def _mode(self) -> Any:
        return unflatten_leaves(self.action_space, [c.deterministic_sample() for c in self.children])

    def flat_widths(self) -> list[int]:
        """Columns each child takes in a flat action row (RLlib's split of a single tensor)."""
        widths = []
        for child in self.children:
            if isinstance(child, Categorical):
                widths.append(1)
            elif isinstance(child, MultiCategorical) and isinstance(child.action_space, gs.Box):
                widths.append(int(np.prod(child.action_space.shape)))
            else:
                mode = np.asarray(child._mode())
                widths.append(1 if mode.ndim == 1 else int(np.prod(mode.shape[1:])))
        return widths

    def _split_flat(self, flat: np.ndarray) -> list[np.ndarray]:
        flat = np.asarray(flat).reshape(self.batch_size, -1)
        widths = self.flat_widths()
        if flat.shape[1] != sum(widths):
            raise ValueError(
                f"MultiActionDistribution.logp: a flat action row needs {sum(widths)} columns "
                f"({widths} per leaf), got {flat.shape[1]}"
            )
        return np.split(flat, np.cumsum(widths)[:-1], axis=1)

    def logp(self, actions: Any) -> np.ndarray:
        if isinstance(actions, np.ndarray):
            leaves = self._split_flat(self._check_batch(actions, "logp"))
        else:
            leaves = flatten_leaves(self.action_space, actions)
        total: np.ndarray | None = None
        for child, leaf in zip(self.children, leaves, strict=True):
            value = np.asarray(leaf)
            if isinstance(child, Categorical):
                if value.ndim > 1:
                    value = value.reshape(value.shape[0])
                # RLlib casts Categorical children with .int() (truncation toward zero).
                value = np.trunc(value).astype(np.int64) if value.dtype.kind == "f" else value
            lp = child.logp(value)
            total = lp if total is None else (total + lp).astype(F32)
        assert total is not None, "an action space has at least one leaf"
        return total

    def entropy(self) -> np.ndarray:
        total: np.ndarray | None = None
        for child in self.children:
            ent = child.entropy()
            total = ent if total is None else (total + ent).astype(F32)
        assert total is not None, "an action space has at least one leaf"
        return total

    def sampled_action_logp(self) -> np.ndarray:
        total: np.ndarray | None = None
        for child in self.children:
            lp = child.sampled_action_logp()
            total = lp if total is None else (total + lp).astype(F32)
        assert total is not None, "an action space has at least one leaf"
        return total
