"""The batch step: many validated ``Step``s through the model as one batch.

    gather session rows ─► one runtime call ─► masks ─► distribution (sample or mode,
    logp, entropy) ─► scatter new session state ─► encode the batch once

``BatchStep.run`` is the batch function handed to the ``Batcher``. It runs inline or in
the batcher's thread, never concurrently with itself for one model version.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlserve.models.distributions import DistributionError, UnsupportedMethodError
from rlserve.models.interface import ModelSignature
from rlserve.service.serving.pipeline import Pipeline
from rlserve.service.serving.runtime import Runtime
from rlserve.service.sessions.base import SessionStore
from rlserve.service.sessions.slabs import STATELESS_SLOT
from rlserve.service.step import codec, masks
from rlserve.service.step.codec import floats_json
from rlserve.service.step.prepare import Step
from rlserve.service.step.trees import tree_set_row, tree_slice, tree_where


@dataclass(slots=True)
class BatchOutput:
    """A batch's results, JSON-ready once for the whole batch (one ``tolist`` per array)."""

    actions: Any  # model-space action structure, leading axis = batch rows (for clip/unsquash)
    actions_json: list[Any]  # env-space JSON values, one per row
    logp: list[Any] | None
    value: list[Any] | None  # only when some request asked for it
    entropy: list[Any] | None
    dist_inputs: list[Any] | None  # only when some request asked for it
    # The same outputs as arrays (B, ...), for tensor wire formats; None where undefined.
    arrays: dict[str, np.ndarray | None] = field(default_factory=dict)


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


class BatchStep:
    """Runs batches of one model version: its runtime, pipeline and session store."""

    def __init__(self, signature: ModelSignature, runtime: Runtime, pipeline: Pipeline, sessions: SessionStore,
                 mask_layout: masks.MaskLayout | None, *, seed: int | None = None):
        self.signature = signature
        self.runtime = runtime
        self.pipeline = pipeline
        self.sessions = sessions
        self.mask_layout = mask_layout
        self.obs_dtype = runtime.input_dtypes.get("obs", np.dtype(np.float32))
        self.rng = np.random.default_rng(seed)
        self.stateful = signature.is_recurrent or signature.uses_prev_actions or signature.uses_prev_rewards

    def run(self, steps: list[Step]) -> list[StepOutput]:
        inputs = {"obs": self._batch_obs(steps)}
        if self.stateful:
            slots = self._slots(steps)
            self._gather(steps, slots, inputs)
        wants_value = any("value" in s.extras for s in steps)
        outputs = self.runtime.run(inputs, value=wants_value)
        dist_inputs = outputs["dist_inputs"]
        dist_inputs = self._apply_masks(steps, dist_inputs)
        actions, logp, entropy = self._act(steps, dist_inputs)
        if self.stateful:
            self._scatter(outputs, slots, actions)
        return self._split(steps, actions, logp, entropy, outputs["value"] if wants_value else None, dist_inputs)

    def _batch_obs(self, steps: list[Step]) -> np.ndarray:
        rows = [s.obs_row for s in steps]
        if None not in rows:  # every request a plain row: one conversion for the batch
            return np.array(rows, dtype=self.obs_dtype)
        if len(steps) == 1:
            obs = steps[0].obs
            assert obs is not None  # its obs_row is None, so it was decoded into obs
            return obs
        return np.concatenate([np.array([s.obs_row], dtype=self.obs_dtype) if s.obs is None else s.obs
                               for s in steps])

    @staticmethod
    def _slots(steps: list[Step]) -> np.ndarray:
        sessions = [s for step in steps for s in step.sessions]
        return np.fromiter((STATELESS_SLOT if s is None else s.slot for s in sessions), np.int64, len(sessions))

    def _gather(self, steps: list[Step], slots: np.ndarray, inputs: dict[str, np.ndarray]) -> None:
        reset = np.concatenate([s.reset for s in steps])
        rewards: np.ndarray | None = None
        if any(r is not None for s in steps for r in s.rewards):
            rewards = np.fromiter((np.nan if r is None else r for s in steps for r in s.rewards), np.float32,
                                  len(slots))
        inputs.update(self.sessions.gather_rows(slots, reset, rewards, self._reported(steps)))

    @staticmethod
    def _reported(steps: list[Step]) -> np.ndarray | None:
        if all(s.prev_actions is None for s in steps):
            return None
        width = next(s.prev_actions.shape[1] for s in steps if s.prev_actions is not None)
        parts = [
            s.prev_actions if s.prev_actions is not None else np.full((s.rows, width), np.nan, np.float32)
            for s in steps
        ]
        return np.concatenate(parts)

    def _apply_masks(self, steps: list[Step], dist_inputs: np.ndarray) -> np.ndarray:
        if all(s.mask is None for s in steps):
            return dist_inputs
        layout = self.mask_layout
        assert layout is not None  # prepare() accepts a mask only when the model has a layout
        mask = np.concatenate([s.mask if s.mask is not None else np.ones((s.rows, layout.width), np.bool_)
                               for s in steps])
        return masks.apply_mask(dist_inputs, mask, layout)

    def _act(self, steps: list[Step], dist_inputs: np.ndarray) -> tuple[Any, Any, Any]:
        spec = self.pipeline.dist_spec
        dist = spec.build(dist_inputs)
        explore = steps[0].explore
        if all(s.explore is explore and not any(s.rngs) for s in steps):
            # The common batch: one mode for every row, no seeded session. The sample's
            # logp skips re-validating indices the distribution drew itself.
            actions = dist.sample(self.rng) if explore else dist.deterministic_sample()
            logp = _optional(dist.logp_of_sample)
        else:
            actions = self._act_mixed(steps, dist, dist_inputs)
            logp = _optional(lambda: dist.logp(actions))
        wants_entropy = any("entropy" in s.extras for s in steps)
        entropy = _optional(dist.entropy) if wants_entropy else None
        return actions, logp, entropy

    def _act_mixed(self, steps: list[Step], dist: Any, dist_inputs: np.ndarray) -> Any:
        """Rows that explore and rows that do not, or rows of seeded sessions."""
        spec = self.pipeline.dist_spec
        explore = np.repeat([s.explore for s in steps], [s.rows for s in steps])
        if explore.all():
            actions = dist.sample(self.rng)
        elif not explore.any():
            actions = dist.deterministic_sample()
        else:
            actions = tree_where(explore, dist.sample(self.rng), dist.deterministic_sample())
        # Seeded sessions draw from their own generator (the one they had when the request
        # was accepted), one row at a time, so an episode replays whatever shares its batch.
        start = 0
        for step in steps:
            for offset, rng in enumerate(step.rngs):
                row = start + offset
                if rng is not None and explore[row]:
                    tree_set_row(actions, row, spec.build(dist_inputs[row:row + 1]).sample(rng))
            start += step.rows
        return actions

    def _scatter(self, outputs: dict[str, np.ndarray], slots: np.ndarray, actions: Any) -> None:
        state_out = [outputs[f"state_out_{i}"] for i in range(len(self.signature.state))]
        flat = self.pipeline.flatten_actions(actions) if self.signature.uses_prev_actions else None
        self.sessions.scatter_rows(slots, state_out, flat)

    def _split(self, steps, actions, logp, entropy, value, dist_inputs) -> list[StepOutput]:
        """Encode the batch once (one ``tolist`` per array); each request gets its row range."""
        batch = BatchOutput(
            actions=actions,
            actions_json=codec.encode_batch(self.pipeline.action_space, actions),
            logp=floats_json(logp),
            value=floats_json(value),  # None unless a request asked for it
            entropy=floats_json(entropy),
            dist_inputs=dist_inputs.tolist() if any("dist_inputs" in s.extras for s in steps) else None,
            arrays={"logp": logp, "value": value, "entropy": entropy, "dist_inputs": dist_inputs},
        )
        results, start = [], 0
        for step in steps:
            stop = start + step.rows
            results.append(StepOutput(batch, start, stop))
            start = stop
        return results


def _optional(fn):
    """Methods RLlib leaves undefined (Deterministic.logp, SquashedGaussian.entropy) -> None."""
    try:
        return fn()
    except (UnsupportedMethodError, NotImplementedError):
        return None
    except DistributionError:
        raise
