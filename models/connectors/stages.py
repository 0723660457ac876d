"""The server stages of a new-stack bundle's connector pipeline (numpy, torch-free).

``ConnectorPipeline.from_json(manifest["connectors"], obs_space)`` rebuilds the stages
``plan.py`` put on the server, in RLlib's order, and ``transform_batch`` runs a batch of
decoded observations through them to the model's ``obs`` input ``(B, *obs_shape)``:

- ``FlattenObservations``: ``flatten.py``'s rows (Dict keys sorted, one-hots);
- ``MeanStdFilter``: the checkpoint's statistics, frozen (RLlib's stored connector keeps
  pushing every observation into them; a server must not), ``rlserve.models.filters``'
  arithmetic, cast back to the input's dtype.

The session-dependent stages (previous actions and rewards, frame stacks) are in the
model's graph; ``graph`` keeps their JSON for ``inspect``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from gymnasium import spaces as gs

from rlserve.models.connectors.flatten import flatten_batch, remove_keys
from rlserve.models.filters import MeanStdFilter
from rlserve.models.spaces import space_from_json

__all__ = ["ConnectorPipeline", "Stage"]


class Stage(Protocol):
    name: str

    def __call__(self, batch: Any) -> Any:
        """A batch of observations (a list, or an array for Box rows) -> the next stage's."""


class _Flatten:
    name = "FlattenObservations"

    def __init__(self, input_space: gs.Space, keys_to_remove: Sequence[str]):
        self.space = remove_keys(input_space, keys_to_remove)
        self.removed = tuple(keys_to_remove)

    def __call__(self, batch: Any) -> np.ndarray:
        if self.removed:
            batch = [{k: v for k, v in obs.items() if k not in self.removed} for obs in batch]
        return flatten_batch(self.space, batch)


class _Filter:
    name = "MeanStdFilter"

    def __init__(self, state: Mapping[str, Any]):
        self.filter = MeanStdFilter.from_state(state)

    def __call__(self, batch: Any) -> np.ndarray:
        rows = batch if isinstance(batch, np.ndarray) else np.stack([np.asarray(x) for x in batch])
        return self.filter.apply(rows)


def _stage(node: Mapping[str, Any]) -> Stage:
    name = node.get("class")
    if name == "FlattenObservations":
        return _Flatten(space_from_json(node["input_space"]), list(node.get("keys_to_remove") or []))
    if name == "MeanStdFilter":
        return _Filter(node["filter"])
    raise ValueError(f"connectors.server: unknown stage {name!r} (this rlserve runs FlattenObservations and "
                     "MeanStdFilter)")


class ConnectorPipeline:
    """The server stages; ``transform_batch`` has the old preprocessors' call shape."""

    def __init__(self, obs_space: gs.Space, stages: Sequence[Stage], obs_shape: Sequence[int],
                 graph: Sequence[Mapping[str, Any]] = ()):
        self.obs_space = obs_space
        self.stages = tuple(stages)
        self.output_shape = tuple(int(d) for d in obs_shape)
        self.graph = tuple(dict(g) for g in graph)

    @classmethod
    def from_json(cls, node: Mapping[str, Any], obs_space: gs.Space) -> ConnectorPipeline:
        return cls(obs_space, [_stage(s) for s in node.get("server", [])], node["obs_shape"], node.get("graph", []))

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.stages]

    def transform_batch(self, observations: Sequence[Any] | np.ndarray) -> np.ndarray:
        batch: Any = observations
        for stage in self.stages:
            batch = stage(batch)
        out = batch if isinstance(batch, np.ndarray) else np.stack([np.asarray(x) for x in batch])
        if out.shape[1:] != self.output_shape:
            raise ValueError(f"connectors produced rows of shape {list(out.shape[1:])}, the model takes "
                             f"{list(self.output_shape)}")
        return out

    def transform(self, observation: Any) -> np.ndarray:
        return self.transform_batch([observation])[0]
