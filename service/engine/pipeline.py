"""The torch-free pieces around the runtime, built from a bundle manifest.

Observation side: an old-stack bundle's preprocessor (RLlib's exact flattening / one-hot /
pixel rules) then the frozen MeanStd filter; a new-stack bundle's connector stages
(``manifest["connectors"]``: FlattenObservations, a frozen MeanStdFilter, in RLlib's order;
the session-dependent ones are in the model's graph). Action side: the action distribution
spec, masking and the action helpers (flatten for the previous-action window, one-hot where
the bundle keeps RLlib's one-hot previous actions, clip / unsquash for clients).
Everything here comes from ``models/``; this module only wires it to a manifest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces as gs

from rlserve.models.connectors import ConnectorPipeline
from rlserve.models.distributions import ActionDistSpec
from rlserve.models.distributions import actions as action_utils
from rlserve.models.distributions.structure import leaf_spaces
from rlserve.models.export.bundle import Manifest
from rlserve.models.filters import MeanStdFilter, NoFilter, filter_from_state
from rlserve.models.preprocessors import NoPreprocessor, get_preprocessor

OBS_MASK_KEY = "action_mask"  # RLlib's convention for a mask inside a Dict observation
# The old preprocessors' image options; a Box passed through unchanged reads none of them.
_NO_IMAGE_OPTIONS = {"dim": 84, "grayscale": False, "zero_mean": True}


@dataclass
class Pipeline:
    obs_space: gs.Space
    action_space: gs.Space
    preprocessor: Any
    obs_filter: MeanStdFilter | NoFilter | None
    dist_spec: ActionDistSpec
    # New-stack bundles: previous actions are kept one-hot (RLlib's PrevActionsPrevRewards),
    # and an "action_mask" key of a Dict observation is only data (the module flattens it),
    # unless the manifest's connectors name it (a module that masks with it: the server then
    # masks with it too, and refuses a row that allows nothing).
    one_hot_actions: bool = False
    obs_mask_key: str | None = OBS_MASK_KEY

    def __post_init__(self) -> None:
        self._identity = self.passes_through
        # Unsquashing and clipping touch float Box leaves only; without one they change nothing.
        self.bounds_apply = any(isinstance(s, gs.Box) and not action_utils.is_int_box(s)
                                for s in leaf_spaces(self.action_space))

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> Pipeline:
        obs_space = manifest.observation_space
        connectors = manifest.connectors
        if connectors is not None:
            return cls._from_connectors(manifest, obs_space, connectors)
        filter_state = manifest.filter
        return cls(
            obs_space=obs_space,
            action_space=manifest.action_space,
            preprocessor=get_preprocessor(obs_space, manifest.model_config),
            obs_filter=filter_from_state(filter_state) if filter_state else None,
            dist_spec=ActionDistSpec.from_json(manifest.action_dist),
        )

    @classmethod
    def _from_connectors(cls, manifest: Manifest, obs_space: gs.Space, connectors: dict[str, Any]) -> Pipeline:
        stages = ConnectorPipeline.from_json(connectors, obs_space)
        # Without server stages a Box observation is the model's input as it is.
        plain = not stages.stages and isinstance(obs_space, gs.Box)
        return cls(
            obs_space=obs_space,
            action_space=manifest.action_space,
            preprocessor=NoPreprocessor(obs_space, _NO_IMAGE_OPTIONS) if plain else stages,
            obs_filter=None,
            dist_spec=ActionDistSpec.from_json(manifest.action_dist),
            one_hot_actions=(connectors.get("prev_action_encoding") == "one_hot"
                             and isinstance(manifest.action_space, gs.Discrete)),
            obs_mask_key=connectors.get("observation_mask_key"),
        )

    @property
    def passes_through(self) -> bool:
        """True when the preprocessor returns a Box observation unchanged (RLlib's
        NoPreprocessor): the codec's decoded arrays already are the model input."""
        return isinstance(self.preprocessor, NoPreprocessor) and isinstance(self.obs_space, gs.Box)

    def preprocess(self, observations: list[Any] | np.ndarray) -> np.ndarray:
        """Raw observations (a list, or a stacked array for Box spaces) -> the model's
        ``obs`` input (B, *obs_shape), filtered."""
        if self._identity:
            if isinstance(observations, np.ndarray):
                flat = observations
            elif len(observations) == 1:
                first = observations[0]
                flat = (first if isinstance(first, np.ndarray) else np.asarray(first))[None]
            else:
                flat = np.stack(observations)
        else:
            flat = np.asarray(self.preprocessor.transform_batch(observations))
        if self.obs_filter is not None:
            flat = self.obs_filter.apply(flat)
        return flat

    def action_from_json(self, value: Any) -> Any:
        """An env-space JSON action -> a model-space batch of one; ValueError if invalid."""
        return action_utils.actions_from_json(self.action_space, value)

    def prev_action_from_json(self, value: Any) -> Any:
        """A reported previous action -> a model-space batch of one; ValueError if invalid.
        Float Box leaves are not held to the bounds: the model saw the raw sampled action."""
        return action_utils.prev_action_from_json(self.action_space, value)

    def flatten_actions(self, actions: Any) -> np.ndarray:
        """(B, A) float32 rows as the model's prev_actions input wants them: flattened
        actions, or one-hot rows of a Discrete action where the bundle keeps them so."""
        flat = np.asarray(action_utils.flatten_actions(self.action_space, actions), dtype=np.float32)
        if self.one_hot_actions:
            n = int(self.action_space.n)  # type: ignore[attr-defined]  # plan.py allows Discrete only
            return np.eye(n, dtype=np.float32)[flat[:, 0].astype(np.int64)]
        return flat

    def clip(self, actions: Any) -> Any:
        return action_utils.clip_actions(self.action_space, actions)

    def unsquash(self, actions: Any) -> Any:
        return action_utils.unsquash_actions(self.action_space, actions)
