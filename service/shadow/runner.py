"""The shadow's runner: the candidate's batches, in the candidate's own process.

It runs batches of rows (no session twice: ``ShadowQueue.take``) through the candidate's
own parts (its ``BatchStep``'s pipeline, runtime and distribution), with its own recurrent
state per session in a session store of its own (``SessionStore``: the candidate process's
memory, keyed by the live session's id; never a store any route or resolver sees, so a
candidate that is another version of the live model shares no id or slot with it). The
process (``rlserve.service.serving.shadow_child``) feeds it what the server hands over.

Per row the candidate is fed what actually happened: the live model's raw action of the
previous step as its previous action (the one the environment reported instead, where the
client sent ``prev_action``), the reward the client reported, and the episode's starts.
It computes the logp of the live action in its own distribution, its own action (sampled,
or the mode where the live request did not explore) and its dist inputs; its state then
advances as if it had taken the live action. A row of a session it holds no state for,
not at an episode start (its earlier rows were dropped, or the shadow began mid-episode),
is skipped (counted) until that session's next episode start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlserve.models.distributions import DistributionError, UnsupportedMethodError
from rlserve.service.experience.records import ShadowScore, packer
from rlserve.service.sessions.slabs import STATELESS_SLOT
from rlserve.service.sessions.store import Session, SessionStore
from rlserve.service.shadow.durable import DurableShadowState
from rlserve.service.shadow.rows import ShadowRow
from rlserve.service.step import codec, masks
from rlserve.service.step.batch import BatchStep
from rlserve.service.step.trees import explore_where, tree_map

log = logging.getLogger("rlserve.shadow")

MAX_ROWS = 256  # rows per candidate batch


@dataclass
class RunnerCounts:
    taken: int = 0  # rows taken into candidate batches (run, skipped or failed)
    scored: int = 0  # rows the candidate ran
    unknown: int = 0  # rows of a session without shadow state, skipped until its next episode start
    failed: int = 0  # rows of candidate batches that raised (logged)
    unwritten: int = 0  # scores of logged steps the experience log's queue refused


@dataclass
class Scored:
    """One candidate batch's results (B rows): what ``score`` returns, for tests and the log."""

    rows: list[ShadowRow]
    logp: np.ndarray  # (B,) float64, NaN where the distribution defines none
    actions: list[Any]  # the candidate's own actions, as JSON values
    dist_inputs: np.ndarray  # (B, N) float32


class ShadowRunner:
    def __init__(self, candidate: BatchStep, label: str, *, max_sessions: int,
                 idle_ttl_s: float, seed: int | None = None,
                 sink: Callable[[list[ShadowScore]], bool] | None = None,
                 durable: DurableShadowState | None = None):
        self.candidate = candidate
        self.label = label  # "<model>@<version>" of the candidate
        self.store = SessionStore(candidate.signature, version=label, max_sessions=max_sessions,
                                  idle_ttl_s=idle_ttl_s, initial_slots=16, tombstones=0)
        self.rng = np.random.default_rng(seed)
        self.sink = sink  # the experience log's shadow table (None: the model is not logged)
        self.durable = durable  # the state in the external session store (None: this process only)
        self._pack = packer(candidate.pipeline.action_space)
        self.counts = RunnerCounts()

    def run(self, rows: list[ShadowRow]) -> None:
        """Score ``rows``; a batch that raises is counted and logged, never raised."""
        try:
            self.score(rows)
        except Exception:  # the candidate's bug stops neither the process nor the server
            self.counts.failed += len(rows)
            log.exception("shadow %s: a candidate batch failed", self.label)
        self.counts.taken += len(rows)

    def close(self) -> None:
        if self.durable is not None:
            self.durable.close()

    def score(self, rows: list[ShadowRow]) -> Scored | None:
        """Run one batch of ``rows`` (no session twice) through the candidate."""
        kept, slots, reset = self._sessions(rows)
        if not kept:
            return None
        candidate = self.candidate
        obs = candidate.pipeline.preprocess([row.obs for row in kept])
        inputs = {"obs": np.ascontiguousarray(obs, dtype=candidate.obs_dtype)}
        if candidate.stateful:
            inputs.update(self.store.gather_rows(slots, reset, _rewards(kept), _reported(kept)))
        outputs = candidate.runtime.run(inputs, value=False)
        dist_inputs = self._masked(kept, outputs["dist_inputs"])
        taken = tree_map(lambda *leaves: np.concatenate(leaves), *[row.action for row in kept])
        logp, own = self._act(kept, dist_inputs, taken)
        if candidate.stateful:
            state_out = [outputs[f"state_out_{i}"] for i in range(len(candidate.signature.state))]
            flat = candidate.pipeline.flatten_actions(taken) if candidate.signature.uses_prev_actions else None
            self.store.scatter_rows(slots, state_out, flat)
        self._advance(kept)
        self.counts.scored += len(kept)
        scored = Scored(kept, logp, codec.encode_batch(candidate.pipeline.action_space, own),
                        np.asarray(dist_inputs, np.float32))
        if self.sink is not None:
            self._write(scored)
        return scored

    def _holds(self, row: ShadowRow) -> Session | None:
        """The session's state here, when it is the state the row's previous step left."""
        session = self.store.live(row.session_id)  # type: ignore[arg-type]
        return session if session is not None and session.steps == row.steps - 1 else None

    def _sessions(self, rows: list[ShadowRow]) -> tuple[list[ShadowRow], np.ndarray, np.ndarray]:
        """The rows the candidate can run, their slots and episode starts. A session whose
        state is not held here at the row's previous step is read from the external store."""
        store = self.store
        if self.durable is not None:
            missing = {row.session_id: row for row in rows
                       if row.session_id is not None and not row.reset and self._holds(row) is None}
            if missing:
                for (session_id, row), data in zip(missing.items(), self.durable.read(list(missing)), strict=True):
                    if data is not None:
                        self.durable.adopt(store, session_id, data, row.steps - 1)
        kept: list[ShadowRow] = []
        slots: list[int] = []
        starts: list[bool] = []
        for row in rows:
            if row.session_id is None:
                slot, start = STATELESS_SLOT, False
            else:
                if row.reset:
                    session = store.live(row.session_id) or store.create(row.session_id)
                    start = True
                else:
                    held = self._holds(row)
                    if held is None:
                        self.counts.unknown += 1
                        continue
                    session, start = held, False
                store.touch(session)
                slot = session.slot
            kept.append(row)
            slots.append(slot)
            starts.append(start)
        return kept, np.array(slots, np.int64), np.array(starts, bool)

    def _advance(self, rows: list[ShadowRow]) -> None:
        """Count the step in each session (the live session's count), write the sessions to
        the external store, and let go of those whose episode ended."""
        stepped: list[Session] = []
        for row in rows:
            if row.session_id is None:
                continue
            session = self.store.live(row.session_id)
            if session is None:
                continue
            if row.end:
                self.store.forget(session)
            else:
                session.steps = row.steps
                stepped.append(session)
        if self.durable is not None:
            self.durable.write(self.store, stepped)

    def _masked(self, rows: list[ShadowRow], dist_inputs: np.ndarray) -> np.ndarray:
        layout = self.candidate.mask_layout
        if layout is None or all(row.mask is None for row in rows):
            return dist_inputs
        mask = np.stack([np.ones(layout.width, bool) if row.mask is None else row.mask for row in rows])
        return masks.apply_mask(dist_inputs, mask, layout)

    def _act(self, rows: list[ShadowRow], dist_inputs: np.ndarray, taken: Any) -> tuple[np.ndarray, Any]:
        """(the logp of the live actions ``taken``, the candidate's own actions)."""
        dist = self.candidate.pipeline.dist_spec.build(dist_inputs)
        explore = np.fromiter((row.explore for row in rows), bool, len(rows))
        if self.candidate.q_policy:
            dist.set_epsilon(np.where(explore, np.nan, 0.0))  # type: ignore[attr-defined]
        try:
            logp = np.asarray(dist.logp(taken), np.float64)
        except (UnsupportedMethodError, NotImplementedError):
            logp = np.full(len(rows), np.nan)
        except DistributionError:  # an action the candidate's distribution cannot have taken
            logp = np.full(len(rows), -np.inf)
        return logp, explore_where(dist, explore, self.rng)

    def _write(self, scored: Scored) -> None:
        scores = [ShadowScore(row.event_id, self.label, float(scored.logp[i]), self._pack(scored.actions[i]),
                              scored.dist_inputs[i].tobytes(), row.time)
                  for i, row in enumerate(scored.rows) if row.event_id is not None]
        if scores and self.sink is not None and not self.sink(scores):
            self.counts.unwritten += len(scores)


def _rewards(rows: list[ShadowRow]) -> np.ndarray | None:
    if all(row.reward is None for row in rows):
        return None
    return np.fromiter((np.nan if row.reward is None else row.reward for row in rows), np.float32, len(rows))


def _reported(rows: list[ShadowRow]) -> np.ndarray | None:
    given = [row.reported for row in rows if row.reported is not None]
    if not given:
        return None
    out = np.full((len(rows), given[0].shape[0]), np.nan, np.float32)
    for index, row in enumerate(rows):
        if row.reported is not None:
            out[index] = row.reported
    return out
