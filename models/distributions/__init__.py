"""Action distributions in numpy, RLlib 2.60's ``torch_action_dist`` behaviour (torch-free).

Entry points: :func:`get_action_dist` (the catalog's choice, an :class:`ActionDistSpec`
with ``num_outputs`` and ``build(inputs)``), :func:`apply_action_mask`, the action
helpers in :mod:`.actions`, and :func:`register_action_dist` for custom classes.
"""

from .actions import (
    action_width,
    actions_from_json,
    actions_to_json,
    clip_actions,
    flatten_actions,
    prev_action_from_json,
    unflatten_actions,
    unsquash_actions,
)
from .autoregressive import BinaryAutoregressive
from .base import (
    ActionDistribution,
    ActionOutOfSupportError,
    DistributionError,
    UnsupportedMethodError,
)
from .beta import Beta
from .catalog import (
    ActionDistSpec,
    UnsupportedActionSpaceError,
    get_action_dist,
    model_output_width,
    resolve_dist_type,
)
from .categorical import Categorical, MultiCategorical
from .deterministic import Deterministic
from .dirichlet import Dirichlet
from .epsilon_greedy import EpsilonGreedyQ
from .gaussian import DiagGaussian, SquashedGaussian
from .masking import FLOAT_MIN, MaskError, apply_action_mask
from .multi import MultiActionDistribution
from .registry import (
    UnknownActionDistError,
    get_registered_action_dist,
    register_action_dist,
    registered_action_dists,
    unregister_action_dist,
)
from .squashed_rlmodule import RLModuleSquashedGaussian

__all__ = [
    "FLOAT_MIN",
    "MaskError",
    "action_width",
    "actions_from_json",
    "actions_to_json",
    "apply_action_mask",
    "clip_actions",
    "flatten_actions",
    "prev_action_from_json",
    "unflatten_actions",
    "unsquash_actions",
    "ActionDistSpec",
    "ActionDistribution",
    "ActionOutOfSupportError",
    "Beta",
    "BinaryAutoregressive",
    "Categorical",
    "Deterministic",
    "DiagGaussian",
    "Dirichlet",
    "DistributionError",
    "EpsilonGreedyQ",
    "MultiActionDistribution",
    "MultiCategorical",
    "RLModuleSquashedGaussian",
    "SquashedGaussian",
    "UnknownActionDistError",
    "UnsupportedActionSpaceError",
    "UnsupportedMethodError",
    "get_action_dist",
    "get_registered_action_dist",
    "model_output_width",
    "register_action_dist",
    "registered_action_dists",
    "resolve_dist_type",
    "unregister_action_dist",
]
