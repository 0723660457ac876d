"""Everything an export needs from one RLModule of a new-stack checkpoint (torch-free).

``read_module_checkpoint(path, module_id)`` returns a ``ModuleCheckpoint``:

    <module>/class_and_ctor_args.pkl      module class, catalog class, the spaces the module
                                          sees (after the env-to-module connectors), the
                                          stored model config (overrides only)
    <module>/module_state.pkl|.msgpack    the weights: {torch state_dict key: array}
    env_runner/env_to_module_connector/   the env spaces and the user's connectors
    env_runner/module_to_env_connector/   normalize_actions / clip_actions
    env_runner/state.pkl                  num_env_steps_sampled_lifetime (DQN's epsilon)
    class_and_ctor_args.pkl               the algorithm class and its config (explore, and
                                          normalize/clip when no pipeline recorded them)

Only the module's own files are required: a module saved on its own is served without
connectors, with RLlib's defaults for the rest (``ModuleCheckpoint.defaults_used`` says which).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces as gs

from rlserve.models.checkpoint.errors import CheckpointError
from rlserve.models.checkpoint.policy import plain_data
from rlserve.models.checkpoint.spaces import rllib_space
from rlserve.models.checkpoint.unpickler import Record
from rlserve.models.newstack.config import effective_model_config
from rlserve.models.newstack.connectors import ConnectorPlan, read_connectors
from rlserve.models.newstack.layout import ModuleFiles, locate_module, read_metadata
from rlserve.models.newstack.modules import CUSTOM_KIND, module_kind
from rlserve.models.newstack.state import class_label, read_ctor, read_state_file

__all__ = ["ModuleCheckpoint", "read_module_checkpoint"]


@dataclass(frozen=True)
class ModuleCheckpoint:
    files: ModuleFiles
    module_class: str  # dotted name, e.g. ray.rllib...DefaultPPOTorchRLModule
    kind: str  # "ppo" (PPO, APPO, IMPALA), "dqn" or "sac": which default module it is; "custom" (traced)
    catalog_class: str | None
    observation_space: gs.Space  # what the module sees (the env-to-module pipeline's output)
    action_space: gs.Space
    stored_model_config: dict[str, Any]
    model_config: dict[str, Any]  # RLlib 2.60's DefaultModelConfig updated with the stored one
    weights: dict[str, np.ndarray]
    connectors: ConnectorPlan
    algorithm_class: str | None
    explore: bool
    env_steps_sampled: int | None  # the EnvRunner's lifetime count (where DQN's epsilon schedule is)
    info: dict[str, Any]  # the module's metadata.json
    defaults_used: tuple[str, ...]  # settings taken from RLlib's defaults, not the checkpoint

    @property
    def module_id(self) -> str:
        return self.files.module_id

    @property
    def normalize_actions(self) -> bool:
        value = self.connectors.normalize_actions
        return True if value is None else value

    @property
    def clip_actions(self) -> bool:
        value = self.connectors.clip_actions
        return False if value is None else value

    def source_json(self) -> dict[str, Any]:
        """Provenance for a bundle manifest (no local paths)."""
        return {
            "kind": "rllib_checkpoint",
            "stack": "new",
            "format": self.files.format,
            "module_id": self.module_id,
            "module_class": self.module_class,
            "catalog_class": self.catalog_class,
            "algorithm": self.algorithm_class,
            "connectors": [step.name for step in self.connectors.env_to_module],
            "defaults_used": list(self.defaults_used),
            "ray_version": self.info.get("ray_version"),
            "checkpoint_version": self.info.get("checkpoint_version"),
        }


def read_module_checkpoint(path: str | Path, module_id: str | None = None, *,
                           trust_code: bool = False) -> ModuleCheckpoint:
    """Read one module of the new-stack checkpoint at ``path`` (see the module docstring).

    A module class that is not one of RLlib's defaults raises ``CustomModuleError``, unless
    ``trust_code``: then its kind is ``"custom"`` (the exporter will import and trace it,
    ``rlserve.models.traced``) and its model config is kept as stored (what RLlib hands it)."""
    files = locate_module(path, module_id)
    ctor = read_ctor(files.directory)
    where = str(files.directory / "class_and_ctor_args.pkl")
    module_class = class_label(ctor["class"])
    kwargs = ctor["kwargs"]
    catalog = kwargs.get("catalog_class")
    catalog_class = None if catalog is None else class_label(catalog)
    kind = module_kind(module_class, catalog_class, where, trust_code=trust_code)
    obs_space = _space(kwargs.get("observation_space"), f"{where} observation_space")
    action_space = _space(kwargs.get("action_space"), f"{where} action_space")
    stored = _model_config(kwargs.get("model_config"), where)
    algorithm_class, config = _algorithm(files)
    connectors = _with_config_actions(read_connectors(files.env_to_module, files.module_to_env), config)
    defaults = []
    if not connectors.found:
        defaults.append("connectors (none found: the module is served on its own input space)")
    if connectors.normalize_actions is None:
        defaults.append("normalize_actions/clip_actions")
    if config is None:
        defaults.append("explore")
    return ModuleCheckpoint(
        files=files, module_class=module_class, kind=kind, catalog_class=catalog_class,
        observation_space=obs_space, action_space=action_space, stored_model_config=stored,
        model_config=_effective(stored, where, kind), weights=_weights(files.state_file),
        connectors=connectors, algorithm_class=algorithm_class,
        explore=bool(config.get("explore", True)) if config is not None else True,
        env_steps_sampled=_env_steps(files), info=read_metadata(files.directory), defaults_used=tuple(defaults),
    )


def _space(node: Any, where: str) -> gs.Space:
    if node is None:
        raise CheckpointError(f"{where}: no space stored")
    return rllib_space(node, where)


def _model_config(value: Any, where: str) -> dict[str, Any]:
    if isinstance(value, Record):  # a DefaultModelConfig object rather than a dict
        value = value.fields
    if value is None:
        return {}
    config = plain_data(value)
    if not isinstance(config, dict):
        raise CheckpointError(f"{where}: model_config is not a dictionary")
    return config


def _effective(stored: dict[str, Any], where: str, kind: str) -> dict[str, Any]:
    """RLlib's effective model config; a custom module is given its config as stored."""
    return dict(stored) if kind == CUSTOM_KIND else effective_model_config(stored, where)


def _weights(state_file: Path) -> dict[str, np.ndarray]:
    state = read_state_file(state_file)
    if not isinstance(state, Mapping) or not state:
        raise CheckpointError(f"{state_file}: expected the module's weights (state_dict name -> array)")
    bad = [k for k, v in state.items() if not (isinstance(k, str) and isinstance(v, np.ndarray)
                                               and v.dtype.kind in "fiub")]
    if bad:
        raise CheckpointError(f"{state_file}: weights must be numeric arrays under string keys; not so for {bad[:5]}")
    return dict(state)


def _algorithm(files: ModuleFiles) -> tuple[str | None, dict[str, Any] | None]:
    """(algorithm class, its config dict) from the algorithm's constructor, if there is one."""
    if files.algorithm is None:
        return None, None
    ctor = read_ctor(files.algorithm)
    config = ctor["args"][0] if ctor["args"] else ctor["kwargs"].get("config")
    if isinstance(config, Record):
        config = config.fields
    return class_label(ctor["class"]), (dict(config) if isinstance(config, Mapping) else None)


def _with_config_actions(plan: ConnectorPlan, config: Mapping[str, Any] | None) -> ConnectorPlan:
    """normalize/clip from the algorithm config where no module-to-env pipeline said."""
    if plan.normalize_actions is not None or config is None:
        return plan
    return dataclasses.replace(plan, normalize_actions=bool(config.get("normalize_actions", True)),
                               clip_actions=bool(config.get("clip_actions", False)))


def _env_steps(files: ModuleFiles) -> int | None:
    path = files.env_runner_state
    if path is None:
        return None
    state = read_state_file(path)
    value = state.get("num_env_steps_sampled_lifetime") if isinstance(state, Mapping) else None
    return int(value) if isinstance(value, int | np.integer) else None
