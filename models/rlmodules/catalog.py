"""Build a default RLModule from a checkpoint's description and load its weights (torch).

``build_rlmodule_policy`` is the new stack's counterpart of ``models/catalog.py``: the
module kind (``ppo``, ``dqn``, ``sac``), the space the module sees, the effective model
config, the action distribution and the connector layout give one ``RLModulePolicy``.

``load_rlmodule_weights`` loads RLlib's state dict by its own names. Every tensor of the
rebuilt module must be in the checkpoint with the same shape; the checkpoint may hold more
only where RLlib's full module does (training-only networks: DQN's and APPO's target
networks, SAC's Q-networks). Anything else means the model config did not describe the
module that was trained, and is refused naming the keys.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from rlserve.models.distributions import ActionDistSpec
from rlserve.models.newstack.dists import is_diag_gaussian
from rlserve.models.rlmodules.graph import ConnectorGraph
from rlserve.models.rlmodules.modules import ActorCriticModule, DQNModule, RLModuleNet, SACPolicyModule
from rlserve.models.rlmodules.policy import RLModulePolicy

__all__ = ["TRAINING_ONLY_PREFIXES", "RLModuleWeightError", "build_rlmodule_policy", "load_rlmodule_weights"]

TRAINING_ONLY_PREFIXES: dict[str, tuple[str, ...]] = {
    "ppo": ("_old_encoder.", "_old_pi."),
    "dqn": ("_target_encoder.", "_target_af.", "_target_vf."),
    "sac": ("qf.", "qf_encoder.", "qf_twin.", "qf_twin_encoder.", "target_qf.", "target_qf_encoder.",
            "target_qf_twin.", "target_qf_twin_encoder."),
}


class RLModuleWeightError(ValueError):
    """The checkpoint's weights do not fit the module its model config describes."""


def build_rlmodule_policy(kind: str, module_obs_shape: Sequence[int], model_config: Mapping[str, Any],
                          dist: ActionDistSpec, connectors: Mapping[str, Any], action_width: int) -> RLModulePolicy:
    """The ``RLModulePolicy`` for a module of ``kind`` (see the module docstring)."""
    if kind == "ppo":
        module: RLModuleNet = ActorCriticModule(module_obs_shape, model_config, dist.num_outputs,
                                                    diag_gaussian=is_diag_gaussian(dist))
    elif kind == "dqn":
        module = DQNModule(module_obs_shape, model_config, dist.num_outputs)
    elif kind == "sac":
        module = SACPolicyModule(module_obs_shape, model_config, dist.num_outputs)
    else:
        raise ValueError(f"unknown RLModule kind {kind!r}")
    graph = ConnectorGraph(connectors.get("graph", []))
    return RLModulePolicy(module, graph, connectors["obs_shape"], dist.num_outputs, action_width)


def load_rlmodule_weights(policy: RLModulePolicy, weights: Mapping[str, np.ndarray], kind: str) -> None:
    """Copy RLlib's state dict into ``policy.module`` (see the module docstring)."""
    target = policy.module.state_dict()
    missing = [k for k in target if k not in weights]
    wrong = [f"{k}: checkpoint {list(np.shape(weights[k]))}, module {list(target[k].shape)}"
             for k in target if k in weights and tuple(np.shape(weights[k])) != tuple(target[k].shape)]
    allowed = TRAINING_ONLY_PREFIXES.get(kind, ())
    extra = [k for k in weights if k not in target and not k.startswith(allowed)]
    if missing or wrong or extra:
        parts = []
        if missing:
            parts.append(f"missing {missing[:8]}{' ...' if len(missing) > 8 else ''}")
        if wrong:
            parts.append(f"shapes differ: {wrong[:4]}")
        if extra:
            parts.append(f"unexpected {extra[:8]}{' ...' if len(extra) > 8 else ''}")
        raise RLModuleWeightError(
            "the checkpoint's weights do not fit the module its model config describes (" + "; ".join(parts) + ")"
        )
    state = {k: torch.from_numpy(np.ascontiguousarray(weights[k], dtype=np.float32)) for k in target}
    policy.module.load_state_dict(state, strict=True)
