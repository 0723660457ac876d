"""What the shadow takes from a live batch, and how it crosses to the candidate's process.

Read after the live answer stands (``rlserve.service.step.batch.BatchStep``), from what the
batch already holds: the observation as received, the live model's raw action (the
action actually taken: it becomes the candidate's previous action), the reward and the
reported previous action that came with the row, the episode start and end, and the
experience log's event id of the step (None where the step is not logged).

The live side builds one ``RowBatch`` per hand-over (``batch_rows``, from every live batch
kept since the last, with the sessions' step counts ``session_steps`` took when each batch's
answers stood): columns, not an object per row, with the actions as the batch's own arrays; that is what is pickled and
sent (few objects: a per-row object with its own small arrays cost ~10 us a row to pickle,
measured). The candidate's process turns it into ``ShadowRow``s (``RowBatch.rows``).
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from rlserve.service.experience.recorder import observation
from rlserve.service.step.trees import tree_map, tree_slice


class ShadowRow(msgspec.Struct, gc=False):
    session_id: str | None  # None: a stateless row
    reset: bool  # the row starts an episode (or a new session)
    obs: Any  # the observation as received (the live model's input where it kept no other)
    action: Any  # the live model's raw action, a batch of one in the action space's structure
    reward: float | None  # the reward reported with this observation (for the previous step)
    reported: np.ndarray | None  # (A,) the flat action the environment took instead, reported with it
    mask: np.ndarray | None  # (W,) the row's action mask
    explore: bool
    end: int  # nonzero: the episode's last observation (its answer is no step of it)
    event_id: str | None
    time: float
    steps: int = 0  # the live session's steps in this episode, this one counted (0: stateless)


class RowBatch(msgspec.Struct, array_like=True, gc=False):
    """A live batch's rows for the shadow, a column per field (B rows)."""

    sessions: list[str | None]
    reset: list[bool]
    obs: list[Any]
    actions: Any  # the live actions, (B, ...) arrays in the action space's structure
    rewards: list[float | None]
    reported: list[np.ndarray | None]
    masks: list[np.ndarray | None]
    explore: list[bool]
    ends: list[int]
    event_ids: list[str | None]
    steps: list[int]
    time: float

    def __len__(self) -> int:
        return len(self.sessions)

    def take(self, keep: list[int]) -> RowBatch:
        """The rows ``keep`` (indices, in order)."""
        if len(keep) == len(self.sessions):
            return self
        index = np.asarray(keep, np.int64)
        pick = lambda column: [column[i] for i in keep]  # noqa: E731
        return RowBatch(pick(self.sessions), pick(self.reset), pick(self.obs),
                        tree_map(lambda leaf: leaf[index], self.actions), pick(self.rewards), pick(self.reported),
                        pick(self.masks), pick(self.explore), pick(self.ends), pick(self.event_ids),
                        pick(self.steps), self.time)

    def wire(self) -> tuple:
        """What crosses to the candidate's process: the columns, each array as its raw bytes
        (a numpy array pickled costs ~10 us, its bytes well under one), per-row arrays stacked."""
        return (self.sessions, self.reset, self.obs, tree_map(_pack, self.actions), self.rewards,
                _stack(self.reported, np.float32, np.nan), _stack(self.masks, bool, True), self.explore, self.ends,
                self.event_ids, self.steps, self.time)

    @classmethod
    def from_wire(cls, wire: tuple) -> RowBatch:
        sessions, reset, obs, actions, rewards, reported, masks, explore, ends, event_ids, steps, now = wire
        rows = len(sessions)
        reported = [None] * rows if reported is None else [None if np.isnan(r[0]) else r for r in _unpack(reported)]
        return cls(sessions, reset, obs, tree_map(_unpack, actions), rewards, reported,
                   [None] * rows if masks is None else list(_unpack(masks)), explore, ends, event_ids, steps, now)

    def rows(self) -> list[ShadowRow]:
        """One ``ShadowRow`` per row (in the candidate's process)."""
        return [ShadowRow(self.sessions[i], self.reset[i], self.obs[i], tree_slice(self.actions, i, i + 1),
                          self.rewards[i], self.reported[i], self.masks[i], self.explore[i], self.ends[i],
                          self.event_ids[i], self.time, self.steps[i])
                for i in range(len(self.sessions))]


class Packed(msgspec.Struct, array_like=True, gc=False):
    """An array as its raw bytes (what crosses to the candidate's process)."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes


def _pack(leaf: np.ndarray) -> Packed:
    leaf = np.ascontiguousarray(leaf)
    return Packed(leaf.dtype.str, leaf.shape, leaf.tobytes())


def _unpack(packed: Packed) -> np.ndarray:
    return np.frombuffer(packed.data, packed.dtype).reshape(packed.shape).copy()


def _stack(rows: list[np.ndarray | None], dtype: Any, fill: Any) -> Packed | None:
    """Per-row arrays (None where a row has none) as one packed (B, N) array, ``fill`` for
    the rows without one; None when no row has one."""
    given = next((row for row in rows if row is not None), None)
    if given is None:
        return None
    out = np.full((len(rows), given.shape[0]), fill, dtype)
    for index, row in enumerate(rows):
        if row is not None:
            out[index] = row
    return _pack(out)


def session_steps(steps: list[Any]) -> list[list[int] | None]:
    """Per step, its session rows' step counts now (None: a step without sessions): what
    ``batch_rows`` reads when it runs later, after the sessions may have stepped again."""
    return [[0 if s is None else s.steps for s in step.sessions] if step.has_sessions else None for step in steps]


def batch_rows(steps: list[Any], results: list[Any], counts: list[list[int] | None], now: float) -> RowBatch:
    """The rows of ``steps`` (each with its ``StepOutput`` and its ``session_steps``, taken
    when its answer stood at ``now``) for the shadow."""
    batch = RowBatch([], [], [], None, [], [], [], [], [], [], [], now)
    pieces = []
    for step, output, steps_now in zip(steps, results, counts, strict=True):
        pieces.append(tree_slice(output.batch.actions, output.start, output.start + step.rows))
        event_ids = step.event_ids
        for offset in range(step.rows):
            session = step.sessions[offset] if steps_now is not None else None
            count = 0 if session is None else steps_now[offset]  # type: ignore[index]
            reported = None if step.prev_actions is None else step.prev_actions[offset]
            # An episode's first step: a reset, or a session's first step (one created by the
            # sessions route starts from its initial state without one); the batch already counted it.
            batch.sessions.append(None if session is None else session.id)
            batch.reset.append(bool(step.reset[offset]) or (session is not None and count == 1))
            batch.obs.append(observation(step, offset))
            batch.rewards.append(step.rewards[offset])
            batch.reported.append(None if reported is None or np.isnan(reported[0]) else reported)
            batch.masks.append(None if step.mask is None else step.mask[offset])
            batch.explore.append(step.explore)
            batch.ends.append(0 if step.ends is None else int(step.ends[offset]))
            batch.event_ids.append(None if event_ids is None else event_ids[offset])
            batch.steps.append(count)
    batch.actions = pieces[0] if len(pieces) == 1 else tree_map(lambda *leaves: np.concatenate(leaves), *pieces)
    return batch
