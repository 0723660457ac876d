"""Choosing the action distribution for an action space: RLlib's ``get_action_dist``.

RLlib 2.60's catalog rule (old API stack, torch):

    model_config["custom_action_dist"] -> the registered class (children for Tuple/Dict
                                          when it subclasses MultiActionDistribution)
    dist_type given explicitly         -> that class, no kwargs (how SAC picks
                                          SquashedGaussian, DDPG Deterministic)
    Box, integer dtype ("int*")        -> MultiCategorical, (max(high)-min(low)+1)
                                          categories per element, actions are indices
    Box, other dtypes, 1-D             -> DiagGaussian (2 * dim outputs)
    Discrete                           -> Categorical
    Tuple / Dict                       -> MultiActionDistribution over the flattened leaves
    Simplex                            -> Dirichlet
    MultiDiscrete                      -> MultiCategorical(input_lens = nvec)

The result is an :class:`ActionDistSpec`: a JSON-able description (RLlib class name,
required model outputs, constructor kwargs) that builds distributions from dist inputs.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces as gs

from ..q_config import q_model_config
from ..spaces import Simplex, space_from_json, space_to_json
from .base import ActionDistribution
from .beta import Beta
from .categorical import Categorical, MultiCategorical
from .deterministic import Deterministic
from .dirichlet import Dirichlet
from .epsilon_greedy import EpsilonGreedyQ
from .gaussian import DiagGaussian, SquashedGaussian
from .multi import MultiActionDistribution
from .registry import builtin_dist_class, get_registered_action_dist
from .structure import leaf_spaces

__all__ = [
    "ActionDistSpec",
    "UnsupportedActionSpaceError",
    "get_action_dist",
    "model_output_width",
    "resolve_dist_type",
]


class UnsupportedActionSpaceError(ValueError):
    """No distribution exists for this action space (RLlib raises too)."""


@dataclass(frozen=True, eq=True)
class ActionDistSpec:
    """How to build the action distribution of a policy.

    ``name``: RLlib's class name ("TorchCategorical", ...) or, with ``custom``, the
    registered custom name. ``num_outputs``: dist inputs the model must produce.
    ``kwargs``: constructor arguments in JSON form (``action_space`` as space JSON,
    ``input_lens``, ``low``/``high``) except ``child_distributions``, a list of specs.
    """

    name: str
    num_outputs: int
    kwargs: dict[str, Any] = field(default_factory=dict)
    custom: bool = False

    __hash__ = None  # type: ignore[assignment]  # kwargs is a dict

    @property
    def children(self) -> list[ActionDistSpec]:
        return list(self.kwargs.get("child_distributions", []))

    @property
    def dist_class(self) -> type[ActionDistribution]:
        return get_registered_action_dist(self.name) if self.custom else builtin_dist_class(self.name)

    def build(self, inputs: np.ndarray) -> ActionDistribution:
        """The distribution for one batch of ``(B, num_outputs)`` dist inputs."""
        arr = np.asarray(inputs)
        if arr.ndim != 2 or arr.shape[1] != self.num_outputs:
            raise ValueError(
                f"{self.name}: dist inputs must have shape (B, {self.num_outputs}), got {arr.shape}"
            )
        return self.dist_class(arr, **self._ctor_kwargs)

    def __call__(self, inputs: np.ndarray) -> ActionDistribution:
        return self.build(inputs)

    @functools.cached_property
    def _ctor_kwargs(self) -> dict[str, Any]:
        """Decoded once per spec: building runs per served batch."""
        out = dict(self.kwargs)
        if "action_space" in out:
            out["action_space"] = _cached_space(out["action_space"])
        if "child_distributions" in out:
            out["child_distributions"] = [child.build_unchecked for child in out["child_distributions"]]
        return out

    def build_unchecked(self, inputs: np.ndarray) -> ActionDistribution:
        return self.dist_class(inputs, **self._ctor_kwargs)

    def to_json(self) -> dict[str, Any]:
        kwargs = {k: v for k, v in self.kwargs.items() if k != "child_distributions"}
        if "child_distributions" in self.kwargs:
            kwargs["child_distributions"] = [c.to_json() for c in self.kwargs["child_distributions"]]
        out: dict[str, Any] = {"class": self.name, "num_outputs": self.num_outputs, "kwargs": kwargs}
        if self.custom:
            out["custom"] = True
        return out

    @classmethod
    def from_json(cls, node: Mapping[str, Any]) -> ActionDistSpec:
        try:
            kwargs = dict(node.get("kwargs", {}))
            if "child_distributions" in kwargs:
                kwargs["child_distributions"] = [cls.from_json(c) for c in kwargs["child_distributions"]]
            return cls(
                name=str(node["class"]),
                num_outputs=int(node["num_outputs"]),
                kwargs=kwargs,
                custom=bool(node.get("custom", False)),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"invalid action dist spec JSON {dict(node)!r}: {exc!r}") from exc


@functools.lru_cache(maxsize=256)
def _space_from_key(key: str) -> gs.Space:
    import json

    return space_from_json(json.loads(key))


def _cached_space(node: Any) -> gs.Space:
    if isinstance(node, gs.Space):
        return node
    import json

    return _space_from_key(json.dumps(node, sort_keys=True))


# --------------------------------------------------------------------------- the rule

_ALIASES: dict[str, type[ActionDistribution]] = {
    "categorical": Categorical,
    "multi_categorical": MultiCategorical,
    "diag_gaussian": DiagGaussian,
    "squashed_gaussian": SquashedGaussian,
    "beta": Beta,
    "deterministic": Deterministic,
    "dirichlet": Dirichlet,
    "multi_action": MultiActionDistribution,
}


def resolve_dist_type(dist_type: str | type[ActionDistribution]) -> type[ActionDistribution]:
    """A class from an RLlib name ("TorchBeta"), our class name ("Beta") or alias ("beta")."""
    if isinstance(dist_type, type) and issubclass(dist_type, ActionDistribution):
        return dist_type
    if isinstance(dist_type, str):
        by_class = {cls.__name__: cls for cls in _ALIASES.values()}
        for table in (_ALIASES, by_class):
            if dist_type in table:
                return table[dist_type]
        try:
            return builtin_dist_class(dist_type)
        except ValueError:
            pass
    raise ValueError(
        f"dist_type {dist_type!r} is not a distribution; expected one of {sorted(_ALIASES)} "
        f"or an RLlib name like 'TorchSquashedGaussian'"
    )


def get_action_dist(
    action_space: gs.Space,
    model_config: Mapping[str, Any] | None = None,
    dist_type: str | type[ActionDistribution] | None = None,
    dist_kwargs: Mapping[str, Any] | None = None,
) -> ActionDistSpec:
    """RLlib's catalog choice for ``action_space`` (see the module docstring).

    ``dist_type`` picks a distribution explicitly, as RLlib's
    ``get_action_dist(..., dist_type=...)``; ``dist_kwargs`` (e.g. ``low``/``high`` for
    SquashedGaussian/Beta) are passed to its constructor. Raises
    :class:`UnsupportedActionSpaceError` for spaces RLlib has no distribution for.
    """
    config = dict(model_config or {})
    if config.get("q_model") is not None:
        return _q_spec(action_space, config)
    custom = config.pop("custom_action_dist", None)
    if custom:
        return _custom_spec(str(custom), action_space, config)
    if dist_type is not None:
        return _explicit_spec(resolve_dist_type(dist_type), action_space, config, dict(dist_kwargs or {}))
    if dist_kwargs:
        raise ValueError("dist_kwargs need an explicit dist_type")
    return _default_spec(action_space, config)


@functools.singledispatch
def _default_spec(space: gs.Space, config: dict[str, Any]) -> ActionDistSpec:
    raise UnsupportedActionSpaceError(
        f"no action distribution for {type(space).__name__} action space {space!r}; supported: "
        "Discrete, MultiDiscrete, Box (1-D float or integer), Simplex, Tuple/Dict of those, "
        "or a custom_action_dist"
    )


@_default_spec.register
def _(space: gs.Box, config: dict[str, Any]) -> ActionDistSpec:
    # RLlib tests the dtype *name*: uint8 Boxes fall through to the Gaussian branch.
    if np.dtype(space.dtype).name.startswith("int"):
        low, high = int(np.min(space.low)), int(np.max(space.high))
        n_cats = int(np.prod(space.shape, dtype=np.int64))
        lens = [high - low + 1] * n_cats
        kwargs = {"input_lens": lens, "action_space": space_to_json(space)}
        return ActionDistSpec(MultiCategorical.rllib_name, sum(lens), kwargs)
    if len(space.shape) > 1:
        raise UnsupportedActionSpaceError(
            f"Box action space with shape {space.shape} has more than one dimension (RLlib's rule); "
            "reshape it to 1-D, use a Tuple, or a custom_action_dist"
        )
    kwargs = {"action_space": space_to_json(space)}
    return ActionDistSpec(DiagGaussian.rllib_name, DiagGaussian.required_model_output_shape(space, config), kwargs)


@_default_spec.register
def _(space: gs.Discrete, config: dict[str, Any]) -> ActionDistSpec:
    return ActionDistSpec(Categorical.rllib_name, int(space.n), {})


@_default_spec.register
def _(space: gs.MultiDiscrete, config: dict[str, Any]) -> ActionDistSpec:
    if space.nvec.ndim != 1:
        raise UnsupportedActionSpaceError(
            f"MultiDiscrete action space needs a 1-D nvec, got shape {space.nvec.shape}"
        )
    lens = [int(n) for n in space.nvec]
    return ActionDistSpec(MultiCategorical.rllib_name, sum(lens), {"input_lens": lens})


@_default_spec.register
def _(space: Simplex, config: dict[str, Any]) -> ActionDistSpec:
    return ActionDistSpec(Dirichlet.rllib_name, Dirichlet.required_model_output_shape(space, config), {})


def _multi_spec(name: str, space: gs.Space, config: dict[str, Any], custom: bool = False) -> ActionDistSpec:
    children = [_default_spec(leaf, config) for leaf in leaf_spaces(space)]
    lens = [c.num_outputs for c in children]
    kwargs = {"action_space": space_to_json(space), "child_distributions": children, "input_lens": lens}
    return ActionDistSpec(name, sum(lens), kwargs, custom=custom)


@_default_spec.register(gs.Tuple)
@_default_spec.register(gs.Dict)
def _(space: gs.Space, config: dict[str, Any]) -> ActionDistSpec:
    return _multi_spec(MultiActionDistribution.rllib_name, space, config)


def _custom_spec(name: str, space: gs.Space, config: dict[str, Any]) -> ActionDistSpec:
    cls = get_registered_action_dist(name)
    if issubclass(cls, MultiActionDistribution) and isinstance(space, gs.Tuple | gs.Dict):
        return _multi_spec(name, space, config, custom=True)
    # A distribution fed by an action head declares the head's width (dist_input_width);
    # required_model_output_shape is then the model's own output width, as in RLlib.
    width = getattr(cls, "dist_input_width", None) or cls.required_model_output_shape
    num = int(width(space, config))
    dist_kwargs = getattr(cls, "dist_kwargs", None)
    kwargs = dict(dist_kwargs(space, config)) if callable(dist_kwargs) else {}
    return ActionDistSpec(name, num, kwargs, custom=True)


_FLOAT_BOX_ONLY = (DiagGaussian, SquashedGaussian, Beta, Deterministic)


def _explicit_spec(
    cls: type[ActionDistribution], space: gs.Space, config: dict[str, Any], kwargs: dict[str, Any]
) -> ActionDistSpec:
    if cls in (MultiCategorical, MultiActionDistribution):
        # These need the catalog's kwargs; take them from the space's own rule.
        spec = _default_spec(space, config)
        if spec.name != cls.rllib_name or kwargs:
            raise ValueError(f"dist_type {cls.__name__} does not fit action space {space!r}")
        return spec
    wants_by_class: dict[type[ActionDistribution], tuple[type[gs.Space], ...]] = {
        Categorical: (gs.Discrete,),
        Dirichlet: (Simplex,),
        **{c: (gs.Box,) for c in _FLOAT_BOX_ONLY},
    }
    wants = wants_by_class.get(cls)
    if wants is not None and not isinstance(space, wants):
        raise ValueError(
            f"dist_type {cls.__name__} needs a {' or '.join(w.__name__ for w in wants)} action space, got {space!r}"
        )
    allowed = {"low", "high"} if cls in (SquashedGaussian, Beta) else set()
    if cls is Categorical:
        allowed = {"temperature"}
    unknown = set(kwargs) - allowed
    if unknown:
        raise ValueError(f"dist_kwargs {sorted(unknown)} not accepted by {cls.__name__}; allowed: {sorted(allowed)}")
    num = int(cls.required_model_output_shape(space, config))
    return ActionDistSpec(cls.rllib_name or cls.__name__, num, dict(kwargs))


def _q_spec(space: gs.Space, config: dict[str, Any]) -> ActionDistSpec:
    """A Q-policy (``model_config["q_model"]``): greedy / epsilon-greedy over the Q-values."""
    q = q_model_config(config)
    assert q is not None
    if not isinstance(space, gs.Discrete):
        raise UnsupportedActionSpaceError(f"q_model: DQN needs a Discrete action space, got {space!r}")
    return ActionDistSpec(EpsilonGreedyQ.rllib_name, int(space.n), {"epsilon": float(q["epsilon"])})


def model_output_width(action_space: gs.Space, model_config: Mapping[str, Any] | None = None) -> int:
    """The model's ``num_outputs`` for the catalog's distribution (RLlib's
    ``required_model_output_shape``); differs from the dist input width only for a
    distribution fed by an action head (e.g. the autoregressive example: 16 vs 6)."""
    spec = get_action_dist(action_space, model_config)
    cls = spec.dist_class
    if spec.custom and getattr(cls, "dist_input_width", None) is not None:
        return int(cls.required_model_output_shape(action_space, dict(model_config or {})))
    return spec.num_outputs
