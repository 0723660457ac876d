"""Which tensor is which: a model version's inputs and outputs as named tensors.

Naming rule (documented in docs/api.md): a space's leaves are named by their path from
the root, parts joined by dots, Dict keys sorted and Tuple items by index, the flattened
order of ``rlserve.models.distributions.structure``:

- ``obs`` for a simple observation space; ``obs.<key>``, ``obs.<index>``, nested
  ``obs.<key>.<index>`` for the leaves of a Dict/Tuple observation;
- ``action`` / ``action.<path>`` likewise for the action, ``prev_action`` /
  ``prev_action.<path>`` for a reported previous action (models that read one);
- ``action_mask`` (0/1 per categorical action, the JSON API's flat layout), ``reward``
  (models that read previous rewards), and the outputs ``logp``, ``value``, ``entropy``,
  ``dist_inputs`` and, for Q-policies only, ``q_values``.

Every tensor has the batch as its first dimension (``-1`` in the metadata); a request's
tensors share one batch size. Discrete leaves and scalars are ``[B]`` (``[B, 1]`` is
taken too).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces as gs

from rlserve.models.distributions.structure import leaf_paths, leaf_spaces
from rlserve.models.spaces import Simplex
from rlserve.service.errors import BadRequest
from rlserve.service.protocols.kserve_v2.tensors import datatype_of
from rlserve.service.protocols.kserve_v2.wire import MetadataTensor
from rlserve.service.serving.policy import Policy
from rlserve.service.step.columns import is_structured

OBS, MASK, PREV_ACTION, REWARD = "obs", "action_mask", "prev_action", "reward"
LOGP, VALUE, ENTROPY, DIST_INPUTS, Q_VALUES = "logp", "value", "entropy", "dist_inputs", "q_values"
EXTRAS = (VALUE, ENTROPY, DIST_INPUTS, Q_VALUES)  # outputs sent only when asked for by name
_LEAVES = (gs.Box, gs.Discrete, gs.MultiDiscrete, gs.MultiBinary, Simplex)


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One tensor: its name, datatype, one row's shape, and the leaf space it carries."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    space: gs.Space | None = None
    optional: bool = False

    @property
    def leaf(self) -> gs.Space:
        """The leaf space (every observation and action tensor has one)."""
        assert self.space is not None, f"tensor {self.name} carries no space"
        return self.space

    def metadata(self) -> MetadataTensor:
        return MetadataTensor(name=self.name, datatype=self.datatype, shape=[-1, *self.shape])


@dataclass(frozen=True)
class Layout:
    obs_space: gs.Space
    action_space: gs.Space
    obs: tuple[TensorSpec, ...]
    action: tuple[TensorSpec, ...]
    mask: TensorSpec | None
    prev_action: tuple[TensorSpec, ...]
    reward: TensorSpec | None
    scores: tuple[TensorSpec, ...]  # logp, value, entropy, dist_inputs (q_values)
    inputs: dict[str, tuple[str, int, TensorSpec]] = field(default_factory=dict)  # name -> (kind, leaf, spec)
    outputs: dict[str, TensorSpec] = field(default_factory=dict)
    default_outputs: tuple[str, ...] = ()
    action_index: dict[str, int] = field(default_factory=dict)  # action output name -> its leaf

    def __post_init__(self) -> None:
        self.action_index.update((spec.name, i) for i, spec in enumerate(self.action))

    def metadata(self) -> tuple[list[MetadataTensor], list[MetadataTensor], dict[str, Any]]:
        inputs = [spec for _, _, spec in self.inputs.values()]
        extras = {
            "optional_inputs": [s.name for s in inputs if s.optional],
            "default_outputs": list(self.default_outputs),
        }
        return [s.metadata() for s in inputs], [s.metadata() for s in self.outputs.values()], extras


def _leaves(space: gs.Space, root: str) -> list[tuple[str, gs.Space]]:
    if not is_structured(space):
        return [(root, space)]
    return [(".".join([root, *map(str, path)]), leaf)
            for path, leaf in zip(leaf_paths(space), leaf_spaces(space), strict=True)]


def _input_spec(name: str, space: gs.Space, optional: bool = False) -> TensorSpec:
    if not isinstance(space, _LEAVES):
        raise BadRequest(
            f"tensor '{name}' would carry a {type(space).__name__} space, which has no tensor form in the Open "
            "Inference Protocol; act on this model through the JSON API (POST /v1/models/<name>/act)",
            field=name, expected=f"leaves of types {[t.__name__ for t in _LEAVES]}", received=type(space).__name__)
    shape = () if isinstance(space, gs.Discrete) else tuple(space.shape)
    return TensorSpec(name, datatype_of(np.dtype(space.dtype)), shape, space, optional)


def _action_spec(name: str, space: gs.Space, optional: bool = False) -> TensorSpec:
    """Actions go out as the JSON API writes them: integers as INT64, floats as FP32 (FP64
    for a float64 Box)."""
    spec = _input_spec(name, space, optional)
    dtype = np.dtype(space.dtype)
    datatype = ("FP64" if dtype == np.float64 else "FP32") if dtype.kind == "f" else "INT64"
    return TensorSpec(name, datatype, spec.shape, space, optional)


def _build(policy: Policy) -> Layout:
    pipeline, signature = policy.pipeline, policy.step.signature
    obs = tuple(_input_spec(name, leaf) for name, leaf in _leaves(pipeline.obs_space, OBS))
    action = tuple(_action_spec(name, leaf) for name, leaf in _leaves(pipeline.action_space, "action"))
    mask_layout = policy.preparer.mask_layout
    mask = None if mask_layout is None else TensorSpec(MASK, "BOOL", (mask_layout.width,), optional=True)
    prev_action: tuple[TensorSpec, ...] = ()
    if signature.uses_prev_actions:
        prev_action = tuple(_action_spec(name, leaf, optional=True)
                            for name, leaf in _leaves(pipeline.action_space, PREV_ACTION))
    reward = TensorSpec(REWARD, "FP32", (), optional=True) if signature.uses_prev_rewards else None
    scores: tuple[TensorSpec, ...] = (
        TensorSpec(LOGP, "FP32", ()), TensorSpec(VALUE, "FP32", ()), TensorSpec(ENTROPY, "FP32", ()),
        TensorSpec(DIST_INPUTS, "FP32", (signature.num_outputs,)))
    if policy.preparer.q_policy:
        scores += (TensorSpec(Q_VALUES, "FP32", (signature.num_outputs,)),)
    inputs: dict[str, tuple[str, int, TensorSpec]] = {}
    for kind, specs in ((OBS, obs), (MASK, (mask,)), (PREV_ACTION, prev_action), (REWARD, (reward,))):
        for i, spec in enumerate(specs):
            if spec is not None:
                inputs[spec.name] = (kind, i, spec)
    outputs = {spec.name: spec for spec in (*action, *scores)}
    return Layout(pipeline.obs_space, pipeline.action_space, obs, action, mask, prev_action, reward, scores,
                  inputs, outputs, default_outputs=(*(s.name for s in action), LOGP))


_CACHE: weakref.WeakKeyDictionary[Policy, Layout] = weakref.WeakKeyDictionary()


def layout_of(policy: Policy) -> Layout:
    """``policy``'s tensors (built once per loaded version); a 400 naming the leaf when its
    spaces have no tensor form (a Repeated observation, for one)."""
    layout = _CACHE.get(policy)
    if layout is None:
        layout = _CACHE[policy] = _build(policy)
    return layout
