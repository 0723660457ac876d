"""Distribution classes by name: RLlib's built-ins and user-registered custom ones.

Custom distributions play the role of RLlib's ``ModelCatalog.register_custom_action_dist``
plus ``model_config["custom_action_dist"]``. A custom class subclasses
:class:`ActionDistribution` and declares, like RLlib's::

    @staticmethod
    def required_model_output_shape(action_space, model_config) -> int

It is constructed as ``cls(inputs, **kwargs)``; kwargs are ``{}`` unless the class defines
``dist_kwargs(action_space, model_config) -> dict`` (a classmethod returning JSON-able
values, so a bundle manifest can store them). A subclass of
:class:`MultiActionDistribution` receives RLlib's child distributions for Tuple/Dict spaces.
"""

from __future__ import annotations

import threading

from .autoregressive import RLLIB_PATHS as AUTOREGRESSIVE_PATHS
from .autoregressive import BinaryAutoregressive
from .base import ActionDistribution
from .beta import Beta
from .categorical import Categorical, MultiCategorical
from .deterministic import Deterministic
from .dirichlet import Dirichlet
from .epsilon_greedy import EpsilonGreedyQ
from .gaussian import DiagGaussian, SquashedGaussian
from .multi import MultiActionDistribution
from .squashed_rlmodule import RLModuleSquashedGaussian

__all__ = [
    "BUILTIN_DISTRIBUTIONS",
    "UnknownActionDistError",
    "builtin_dist_class",
    "get_registered_action_dist",
    "register_action_dist",
    "registered_action_dists",
    "unregister_action_dist",
]

BUILTIN_DISTRIBUTIONS: dict[str, type[ActionDistribution]] = {
    cls.rllib_name: cls
    for cls in (
        Categorical,
        MultiCategorical,
        DiagGaussian,
        SquashedGaussian,
        RLModuleSquashedGaussian,
        Beta,
        Deterministic,
        Dirichlet,
        MultiActionDistribution,
        EpsilonGreedyQ,
    )
}

# Custom distributions of RLlib's examples, under the names their users register them
# with and the dotted class paths RLlib records; user registrations may replace them.
_CUSTOM: dict[str, type[ActionDistribution]] = {
    name: BinaryAutoregressive for name in ("binary_autoreg_dist", *AUTOREGRESSIVE_PATHS)
}
_LOCK = threading.Lock()


class UnknownActionDistError(ValueError):
    """A distribution name that is neither built in nor registered."""


def register_action_dist(name: str, cls: type[ActionDistribution]) -> None:
    """Register ``cls`` under ``name`` for ``model_config["custom_action_dist"]``.

    Registering a name again replaces the class (as RLlib's registry does).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"custom action dist name must be a non-empty string, got {name!r}")
    if not (isinstance(cls, type) and issubclass(cls, ActionDistribution)):
        raise TypeError(f"custom action dist {name!r} must subclass ActionDistribution, got {cls!r}")
    if not callable(getattr(cls, "required_model_output_shape", None)):
        raise TypeError(f"custom action dist {name!r} must define required_model_output_shape()")
    with _LOCK:
        _CUSTOM[name] = cls


def unregister_action_dist(name: str) -> None:
    with _LOCK:
        _CUSTOM.pop(name, None)


def registered_action_dists() -> list[str]:
    with _LOCK:
        return sorted(_CUSTOM)


def get_registered_action_dist(name: str) -> type[ActionDistribution]:
    with _LOCK:
        cls = _CUSTOM.get(name)
    if cls is None:
        raise UnknownActionDistError(
            f"custom_action_dist {name!r} is not registered; registered names: "
            f"{registered_action_dists() or '(none)'} (use register_action_dist(name, cls))"
        )
    return cls


def builtin_dist_class(name: str) -> type[ActionDistribution]:
    cls = BUILTIN_DISTRIBUTIONS.get(name)
    if cls is None:
        raise UnknownActionDistError(
            f"unknown action distribution {name!r}; built-in: {sorted(BUILTIN_DISTRIBUTIONS)}"
        )
    return cls
