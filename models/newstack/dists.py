"""The action distribution a default RLModule is served with (torch-free).

RLlib's new-stack catalogs pick (``Catalog._get_dist_cls_from_action_space``):

    PPO  Discrete -> TorchCategorical; 1-D float Box -> TorchDiagGaussian (the pi head clamps
         log_std); MultiDiscrete -> TorchMultiCategorical(nvec); Tuple/Dict -> a
         TorchMultiDistribution of those over the leaves (Dict keys sorted). Integer or
         multi-dimensional Box actions are refused (RLlib refuses them too).
    SAC  Box -> TorchSquashedGaussian(low=-1, high=1); Discrete -> TorchCategorical.
    DQN  Discrete -> greedy / epsilon-greedy over the Q-values (``EpsilonGreedyQ``).

Their arithmetic matches the old stack's numpy classes except SAC's squashed Gaussian
(``RLModuleSquashedGaussian``). DQN explores with the epsilon its schedule gives at the
checkpoint's sampled step count (what a restored EnvRunner uses); 0 when unknown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces as gs

from rlserve.models.distributions import (
    ActionDistSpec,
    EpsilonGreedyQ,
    RLModuleSquashedGaussian,
    get_action_dist,
)
from rlserve.models.distributions.structure import leaf_spaces

__all__ = ["dqn_epsilon", "is_diag_gaussian", "module_action_dist"]


def _check_ppo_leaf(space: gs.Space) -> None:
    if isinstance(space, gs.Box):
        if np.issubdtype(space.dtype, np.integer):
            raise ValueError(f"Box(..., {space.dtype}) actions: RLlib's new stack has no distribution for integer "
                             "Box actions (use MultiDiscrete)")
        if len(space.shape) > 1:
            raise ValueError(f"Box actions of shape {space.shape}: RLlib's new stack needs 1-D Box actions")
    elif not isinstance(space, gs.Discrete | gs.MultiDiscrete):
        raise ValueError(f"{type(space).__name__} actions: no default distribution in RLlib's new stack")


def module_action_dist(kind: str, action_space: gs.Space, model_config: Mapping[str, Any],
                       env_steps: int | None = None) -> ActionDistSpec:
    """The spec (``ActionDistSpec``) serving a ``kind`` module's dist inputs; ValueError if none."""
    if kind == "dqn":
        if not isinstance(action_space, gs.Discrete):
            raise ValueError(f"DQN needs a Discrete action space, got {action_space}")
        epsilon = dqn_epsilon(model_config.get("epsilon", 0.0), env_steps)
        return ActionDistSpec(EpsilonGreedyQ.rllib_name, int(action_space.n), {"epsilon": epsilon})
    if kind == "sac":
        if isinstance(action_space, gs.Box) and len(action_space.shape) == 1:
            if model_config.get("free_log_std"):
                raise ValueError("SAC with free_log_std: RLlib requires a diagonal Gaussian there and fails too")
            width = 2 * int(action_space.shape[0])
            return ActionDistSpec(RLModuleSquashedGaussian.rllib_name, width, {"low": -1.0, "high": 1.0})
        if not isinstance(action_space, gs.Discrete):
            raise ValueError(f"SAC supports Box and Discrete actions, got {action_space}")
        return get_action_dist(action_space, {})
    for leaf in leaf_spaces(action_space):
        _check_ppo_leaf(leaf)
    return get_action_dist(action_space, {})


def is_diag_gaussian(spec: ActionDistSpec) -> bool:
    """Whether the pi head feeds a diagonal Gaussian (and so clamps its log_std half)."""
    return spec.name == "TorchDiagGaussian"


def dqn_epsilon(schedule: Any, t: int | None) -> float:
    """RLlib's ``Scheduler``: a number, or ``[[t, value], ...]`` interpolated linearly between
    the points, the last value outside them; evaluated at ``t`` (0 when unknown)."""
    if isinstance(schedule, int | float) and not isinstance(schedule, bool):
        return float(schedule)
    points = _points(schedule)
    step = 0 if t is None else int(t)
    for (l_t, left), (r_t, right) in zip(points[:-1], points[1:], strict=False):
        if l_t <= step < r_t:
            return left + float(step - l_t) / (r_t - l_t) * (right - left)
    return points[-1][1]


def _points(schedule: Any) -> list[tuple[int, float]]:
    if not isinstance(schedule, Sequence) or not schedule:
        raise ValueError(f"epsilon: expected a number or [[timestep, value], ...], got {schedule!r}")
    try:
        points = [(int(p[0]), float(p[1])) for p in schedule]
    except (TypeError, ValueError, IndexError):
        raise ValueError(f"epsilon: expected [[timestep, value], ...], got {schedule!r}") from None
    if [p[0] for p in points] != sorted(p[0] for p in points):
        raise ValueError(f"epsilon: the schedule's timesteps must increase, got {schedule!r}")
    return points
