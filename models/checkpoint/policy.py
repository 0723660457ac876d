"""Everything an export needs from one policy of an RLlib checkpoint (torch-free).

``read_checkpoint(path, policy_id)`` returns a ``PolicyCheckpoint``: the raw observation
and action spaces, the full model config (merged over ``MODEL_DEFAULTS`` and validated),
the observation filter RLlib's config names and its trained statistics (as
``rlserve.models.filters`` state), ``normalize_actions``/``clip_actions``/``explore`` and
the exploration type (how RLlib
samples: ``StochasticSampling`` draws from the action distribution the catalog chooses for
the action space and model config, as the server does), and the
weights under RLlib's names. Where each comes from in ``policy_state.pkl``:

    policy_spec.observation_space / action_space   space_to_dict form (spaces.py)
    policy_spec.config.model                       the model config RLlib built with
    policy_spec.config.observation_filter, normalize_actions, clip_actions, explore,
    exploration_config
    connector_configs["agent"]                     the filter statistics (filters.py)
    weights                                        {RLlib state_dict name: array}

A MeanStdFilter that the config names but neither the policy's connectors nor the
algorithm's worker state holds is reported in ``filter_missing`` (the export refuses to
go on without it unless given one): serving without it would answer differently.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces as gs

from rlserve.models.checkpoint.errors import CheckpointError
from rlserve.models.checkpoint.files import (
    CheckpointFiles,
    algorithm_worker_state,
    locate,
    read_state,
)
from rlserve.models.checkpoint.filters import filter_from_connectors, filter_from_worker
from rlserve.models.checkpoint.spaces import policy_space
from rlserve.models.checkpoint.unpickler import Record, dotted_name
from rlserve.models.config import ConfigError, merge_model_config

__all__ = ["FILTERS", "LegacyCheckpointError", "PolicyCheckpoint", "plain_data", "policy_weights", "read_checkpoint"]

# RLlib's observation_filter settings this reader understands (others are refused).
FILTERS = ("NoFilter", "MeanStdFilter", "ConcurrentMeanStdFilter")
# Top-level config flags RLlib's policy reads besides the model config's copies.
_POLICY_FLAGS = ("_disable_preprocessor_api", "_disable_action_flattening")


class LegacyCheckpointError(CheckpointError):
    """A pre-2.0 checkpoint: it holds weights but no policy spec (spaces, config)."""


@dataclass(frozen=True)
class PolicyCheckpoint:
    files: CheckpointFiles
    observation_space: gs.Space  # the environment's (RLlib's original_space when preprocessed)
    action_space: gs.Space
    model_config: dict[str, Any]  # full: MODEL_DEFAULTS updated with the checkpoint's model
    observation_filter: str  # RLlib's setting, e.g. "MeanStdFilter"
    filter_state: dict[str, Any] | None  # rlserve.models.filters state; None: no filter applies
    filter_source: str | None  # where the statistics were found
    filter_missing: str | None  # why a filter the config names could not be found
    normalize_actions: bool
    clip_actions: bool
    explore: bool
    exploration: str | None  # exploration_config["type"], e.g. "StochasticSampling"
    policy_class: str | None
    weights: dict[str, np.ndarray]

    @property
    def policy_id(self) -> str | None:
        return self.files.policy_id

    def source_json(self) -> dict[str, Any]:
        """Provenance for a bundle manifest (no local paths)."""
        info = self.files.info
        return {
            "kind": "rllib_checkpoint",
            "format": self.files.format,
            "policy_id": self.policy_id,
            "policy_class": self.policy_class,
            "exploration": self.exploration,
            "observation_filter": self.observation_filter,
            "ray_version": info.get("ray_version"),
            "checkpoint_version": info.get("checkpoint_version"),
        }


def plain_data(value: Any) -> Any:
    """Checkpoint values as JSON-like data: classes named in the pickle become their
    dotted names, tuples lists, numpy scalars and arrays Python numbers and lists."""
    name = dotted_name(value)
    if name is not None:
        return name
    if isinstance(value, Mapping):
        return {str(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_data(v) for v in value]
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    return value


def policy_weights(state: Any, source: Path | str) -> dict[str, np.ndarray]:
    """The policy's ``weights``: numeric arrays under string keys (RLlib's state_dict names)."""
    weights = state.get("weights") if isinstance(state, Mapping) else None
    if not isinstance(weights, Mapping) or not weights:
        raise CheckpointError(f"{source}: no policy 'weights' dictionary found")
    bad = [k for k, v in weights.items() if not (isinstance(v, np.ndarray) and v.dtype.kind in "fiub")]
    if bad or not all(isinstance(k, str) for k in weights):
        raise CheckpointError(f"{source}: weights must be numeric arrays under string keys; not so for {bad}")
    return dict(weights)


def read_checkpoint(path: str | Path, policy_id: str | None = None) -> PolicyCheckpoint:
    """Read one policy of the RLlib checkpoint at ``path`` (see the module docstring)."""
    files = locate(path, policy_id)
    source = files.policy_state
    state = read_state(source)
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{source}: expected a policy state dictionary, got {type(state).__name__}")
    if isinstance(state.get("worker"), bytes):
        raise LegacyCheckpointError(
            f"{source}: a pre-2.0 RLlib checkpoint stores no policy spec; give the spaces and "
            "model config with --obs-space/--action-space/--config and its weights with --weights"
        )
    spec = _policy_spec(state, source)
    config = spec.get("config")
    if not isinstance(config, Mapping):
        raise CheckpointError(f"{source}: policy_spec has no 'config' dictionary")
    framework = config.get("framework", "torch")
    if framework != "torch":
        raise CheckpointError(
            f"{source}: policy_spec.config.framework is {framework!r}; only torch policies can be "
            "exported (their weights carry the torch state_dict names)"
        )
    obs_space = policy_space(spec.get("observation_space"), f"{source} policy_spec.observation_space")
    action_space = policy_space(spec.get("action_space"), f"{source} policy_spec.action_space")
    name, filter_state, filter_source, missing = _observation_filter(config, state, files)
    return PolicyCheckpoint(
        files=files,
        observation_space=obs_space,
        action_space=action_space,
        model_config=_model_config(config, action_space, source),
        observation_filter=name,
        filter_state=filter_state,
        filter_source=filter_source,
        filter_missing=missing,
        normalize_actions=bool(config.get("normalize_actions", True)),
        clip_actions=bool(config.get("clip_actions", False)),
        explore=bool(config.get("explore", True)),
        exploration=_exploration(config.get("exploration_config")),
        policy_class=_policy_class(spec.get("policy_class")),
        weights=policy_weights(state, source),
    )


def _policy_spec(state: Mapping[str, Any], source: Path) -> Mapping[str, Any]:
    spec = state.get("policy_spec")
    if isinstance(spec, Record):  # a pickled PolicySpec object (not its serialized dict)
        spec = spec.fields
    if not isinstance(spec, Mapping):
        raise CheckpointError(
            f"{source}: no 'policy_spec' (spaces and config); is this an RLlib 2.x policy state? "
            f"it holds {sorted(map(str, state))}"
        )
    return spec


def _policy_class(value: Any) -> str | None:
    plain = plain_data(value)
    return plain if isinstance(plain, str) else None


def _exploration(exploration_config: Any) -> str | None:
    kind = plain_data(exploration_config.get("type")) if isinstance(exploration_config, Mapping) else None
    return kind if isinstance(kind, str) else None


def _model_config(config: Mapping[str, Any], action_space: gs.Space, source: Path) -> dict[str, Any]:
    model = plain_data(config.get("model", {}))
    if not isinstance(model, dict):
        raise CheckpointError(f"{source}: policy_spec.config.model is not a dictionary")
    for flag in _POLICY_FLAGS:
        if config.get(flag) is True:
            model[flag] = True
    try:
        return merge_model_config(model, action_space)
    except ConfigError as exc:
        raise CheckpointError(f"{source}: policy_spec.config.model: {exc}") from None


def _observation_filter(
    config: Mapping[str, Any], state: Mapping[str, Any], files: CheckpointFiles
) -> tuple[str, dict[str, Any] | None, str | None, str | None]:
    """(setting, filter state, where found, why missing)."""
    source = files.policy_state
    name = plain_data(config.get("observation_filter", "NoFilter"))
    if name not in FILTERS:
        raise CheckpointError(
            f"{source}: policy_spec.config.observation_filter is {name!r}; supported: {list(FILTERS)}"
        )
    if name == "NoFilter":
        return name, None, None, None
    found = filter_from_connectors(state.get("connector_configs"), str(source))
    if found is not None:
        return name, found, f"{source} connector_configs", None
    worker = algorithm_worker_state(files)
    filters = worker.get("filters") if worker is not None else None
    if isinstance(filters, Mapping) and files.policy_id in filters:
        where = f"{files.algorithm_state} worker.filters[{files.policy_id!r}]"
        return name, filter_from_worker(filters[files.policy_id], where), where, None
    looked = [f"{source} (connector_configs)"]
    if files.algorithm_state is not None:
        looked.append(f"{files.algorithm_state} (worker.filters)")
    missing = (
        f"policy_spec.config.observation_filter is {name!r}, but no filter statistics were found in "
        + " or ".join(looked)
    )
    return name, None, None, missing
