"""A batch's results as the answers read them: ``BatchOutput`` for the whole batch and
``StepOutput``, one request's rows of it.

The batch step (``rlserve.service.step.batch``) makes them; a kept answer
(``rlserve.service.step.kept``) and every wire protocol's response read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlserve.service.step import codec
from rlserve.service.step.codec import floats_json
from rlserve.service.step.trees import tree_slice

# The outputs that are a batch's dist_inputs (a Q-policy's q_values are its dist_inputs).
DIST_INPUT_NAMES = frozenset(("dist_inputs", "q_values"))


class BatchOutput:
    """A batch's results: arrays (B, ...) for the tensor wire formats, and the JSON lists
    the JSON answers slice, each made once for the whole batch (one ``tolist`` per array)
    and only when an answer first needs it: a batch of binary requests never builds them.
    """

    __slots__ = ("actions", "arrays", "_action_space", "_want_dist_inputs", "_json")

    def __init__(self, actions: Any, arrays: dict[str, np.ndarray | None], action_space: Any,
                 want_dist_inputs: bool):
        self.actions = actions  # model-space action structure, leading axis = batch rows
        # None where undefined (Deterministic logp), or not asked for by any request (value,
        # entropy, dist_inputs: see BatchStep._run).
        self.arrays = arrays
        self._action_space = action_space
        self._want_dist_inputs = want_dist_inputs
        self._json: dict[str, Any] = {}  # name -> its JSON list (None where the array is)

    @property
    def actions_json(self) -> list[Any]:
        """Env-space JSON values, one per row."""
        if "actions" not in self._json:
            self._json["actions"] = codec.encode_batch(self._action_space, self.actions)
        return self._json["actions"]

    @property
    def logp(self) -> list[Any] | None:
        return self._floats("logp")

    @property
    def value(self) -> list[Any] | None:
        return self._floats("value")

    @property
    def entropy(self) -> list[Any] | None:
        return self._floats("entropy")

    @property
    def dist_inputs(self) -> list[Any] | None:
        """Only when some request of the batch asked for them (or for q_values)."""
        if not self._want_dist_inputs:
            return None
        if "dist_inputs" not in self._json:
            values = self.arrays["dist_inputs"]
            self._json["dist_inputs"] = None if values is None else values.tolist()
        return self._json["dist_inputs"]

    def _floats(self, name: str) -> list[Any] | None:
        if name not in self._json:
            self._json[name] = floats_json(self.arrays[name])
        return self._json[name]


@dataclass(slots=True)
class StepOutput:
    """One request's rows ``start:stop`` of its batch's output; the response slices what
    it uses (a single-row request takes items, not slices)."""

    batch: BatchOutput
    start: int
    stop: int

    def actions(self) -> Any:
        """The request's raw model-space actions (leading axis n)."""
        actions = self.batch.actions
        if isinstance(actions, np.ndarray):
            return actions[self.start:self.stop]
        return tree_slice(actions, self.start, self.stop)
