"""What the shadow takes from a live batch: one ``ShadowRow`` per row whose answer stands.

Read after the live answer stands (``rlserve.service.step.batch.BatchStep``), from what the
batch already holds: the observation as received, the live model's raw action (the
action actually taken: it becomes the candidate's previous action), the reward and the
reported previous action that came with the row, the episode start and end, and the
experience log's event id of the step (None where the step is not logged).
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import numpy as np

from rlserve.service.experience.recorder import observation
from rlserve.service.step.trees import tree_slice


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


def shadow_rows(steps: list[Any], results: list[Any]) -> list[ShadowRow]:
    """The rows of ``steps`` (each with its ``StepOutput``) for the shadow."""
    now = time.time()
    rows: list[ShadowRow] = []
    for step, output in zip(steps, results, strict=True):
        actions = output.batch.actions
        event_ids = step.event_ids
        for offset in range(step.rows):
            session = step.sessions[offset] if step.has_sessions else None
            row = output.start + offset
            reported = None if step.prev_actions is None else step.prev_actions[offset]
            # An episode's first step: a reset, or a session's first step (one created by the
            # sessions route starts from its initial state without one); the batch already counted it.
            start = bool(step.reset[offset]) or (session is not None and session.steps == 1)
            rows.append(ShadowRow(
                None if session is None else session.id, start, observation(step, offset),
                tree_slice(actions, row, row + 1), step.rewards[offset],
                None if reported is None or np.isnan(reported[0]) else reported,
                None if step.mask is None else step.mask[offset], step.explore,
                0 if step.ends is None else step.ends[offset],
                None if event_ids is None else event_ids[offset], now, 0 if session is None else session.steps))
    return rows

