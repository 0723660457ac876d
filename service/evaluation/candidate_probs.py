"""A candidate bundle run over logged episodes: the logp of each logged action under it.

The bundle is loaded as the server loads it (``serving.loading.load_policy``: runtime,
reference check, pipeline), and each step is run as the server's batch step runs it:

    observation as logged ─► the bundle's preprocessor and frozen filter (``Pipeline``)
      ─► state, previous actions and rewards from ``SessionSlabs`` (one slot per episode:
         reset at t = 0, the logged reward of step t-1 reported before step t, the logged
         action of step t pushed after it) ─► one runtime call for every episode still
         running at t ─► the distribution's ``logp`` of the logged action

so a recurrent candidate is stepped through each episode in order, fed the actions that
were actually taken. The value head, when the bundle has one, is read in the same call
(``V(s_t)`` for the doubly robust estimator). Action masks are not logged: the candidate's
distribution is unmasked.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces as gs

from rlserve.service.experience.reader import Episode
from rlserve.service.serving.loading import load_policy
from rlserve.service.serving.policy import Policy
from rlserve.service.sessions.slabs import SessionSlabs
from rlserve.service.settings import Settings
from rlserve.service.step import codec

_ARRAY_ACTIONS = (gs.Box, gs.Discrete, gs.MultiDiscrete, gs.MultiBinary)


class CandidateRefused(ValueError):
    """The candidate cannot be run over this log (one line for the command line)."""


@dataclass
class CandidateOutputs:
    """Per episode (in the order given): the candidate's logp of each logged action (T,)
    and its value of each step's state (T,), or None without a value head."""

    logp: list[np.ndarray]
    values: list[np.ndarray] | None


class Candidate:
    """A loaded candidate bundle (directory or ``.rlsb``): ``run`` it, then ``close`` it."""

    def __init__(self, path: Path):
        self.policy: Policy = load_policy(path, Settings(workers=1, batching=False))
        manifest = self.policy.bundle.manifest
        self.name, self.version = manifest.name, manifest.version
        self.signature = manifest.signature
        self.has_value = "value" in manifest.output_names
        if self.signature.views:
            self.close()
            raise CandidateRefused(f"{self.name}@{self.version} reads a window of past observations "
                                   f"({sorted(self.signature.views)}): not supported by evaluate yet")
        if not isinstance(self.policy.pipeline.action_space, _ARRAY_ACTIONS):
            self.close()
            raise CandidateRefused(f"{self.name}@{self.version}: actions of a "
                                   f"{type(self.policy.pipeline.action_space).__name__} space are not supported "
                                   "by evaluate yet (Box, Discrete, MultiDiscrete, MultiBinary are)")

    @property
    def label(self) -> str:
        return f"{self.name}@{self.version}"

    def close(self) -> None:
        asyncio.run(self.policy.close())

    def run(self, episodes: list[Episode], want_value: bool) -> CandidateOutputs:
        """Every episode's steps, batched across the episodes that are at the same ``t``."""
        pipeline, runtime = self.policy.pipeline, self.policy.runtime
        want_value = want_value and self.has_value
        stateful = self.policy.step.stateful
        slabs = SessionSlabs(self.signature, len(episodes) + 1, len(episodes) + 1) if stateful else None
        lengths = np.array([len(e) for e in episodes])
        logp = [np.empty(n, np.float64) for n in lengths]
        values = [np.empty(n, np.float64) for n in lengths] if want_value else None
        obs_dtype = runtime.input_dtypes.get("obs", np.dtype(np.float32))
        for t in range(int(lengths.max(initial=0))):
            active = np.flatnonzero(lengths > t)
            rows = [episodes[i] for i in active]
            inputs = {"obs": np.asarray(pipeline.preprocess(self._observations(rows, t)), dtype=obs_dtype)}
            actions = _stack_actions([e.actions[t] for e in rows])
            if slabs is not None:
                slots = active + 1  # slot 0 holds the initial values
                if t == 0:
                    slabs.reset(slots)
                else:
                    slabs.report(slots, np.array([e.rewards[t - 1] for e in rows], np.float32), None)
                inputs.update(slabs.gather(slots))
            outputs = runtime.run(inputs, value=want_value)
            dist = pipeline.dist_spec.build(outputs["dist_inputs"])
            if pipeline.dist_spec.dist_class.inputs_are_q_values:
                dist.set_epsilon(np.full(len(rows), np.nan))  # type: ignore[attr-defined]  # the model's own
            step_logp = np.asarray(dist.logp(actions), np.float64)
            for k, i in enumerate(active):
                logp[i][t] = step_logp[k]
                if values is not None:
                    values[i][t] = float(outputs["value"][k])
            if slabs is not None:
                state_out = [outputs[f"state_out_{j}"] for j in range(len(self.signature.state))]
                flat = pipeline.flatten_actions(actions) if self.signature.uses_prev_actions else None
                slabs.scatter(slots, state_out, flat)
        return CandidateOutputs(logp, values)

    def _observations(self, rows: list[Episode], t: int) -> Any:
        space = self.policy.pipeline.obs_space
        raw = [e.observations[t] for e in rows]
        if isinstance(space, gs.Box):
            return np.stack([np.asarray(o) for o in raw])
        # Composite observations are logged as the JSON the client sent.
        values = [json.loads(o) if isinstance(o, str) else _plain(o) for o in raw]
        return codec.decode_batch(space, values, "observations")


def _stack_actions(actions: list[Any]) -> np.ndarray:
    return np.stack([np.asarray(a) for a in actions])


def _plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray | np.generic) else value
