"""What an imported session record may hold: values a session of this policy could have.

``SessionLayout.decode`` checks a record's form (its header, its lengths, the digest of its
tensors' layout). A record from outside (``PUT .../sessions/{id}``, each agent's record of an
episode import) may still hold anything in those bytes, so an import also checks what they
say: the recurrent state and the previous-reward window finite, each row of the
previous-action window one this policy writes (a flattened action, a one-hot row, or the
zeros of an episode's start), and the experience log's open step one this model could have
logged (``rlserve.service.experience.trail_check``). Without it a NaN state was stored and
every later step of the session answered 500, and a forged open step made the log's writer
drop a whole file of other sessions' transitions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces as gs

from rlserve.models.distributions.actions import action_width
from rlserve.models.distributions.structure import leaf_spaces
from rlserve.models.interface import ModelSignature
from rlserve.service.experience.trail_check import trail_problem
from rlserve.service.sessions.record import RecordError, SessionRecord


def check_contents(record: SessionRecord, signature: ModelSignature, pipeline: Any) -> None:
    """``RecordError`` naming the first part of ``record`` no session of this policy holds
    (``pipeline``: its spaces and how it writes previous actions)."""
    names = [f"state '{spec.name}'" for spec in signature.state]
    prev = signature.prev
    if prev.n_prev_actions:
        names.append("the previous-action window")
    if prev.n_prev_rewards:
        names.append("the previous-reward window")
    for name, values in zip(names, record.rows, strict=True):
        if values.dtype.kind == "f" and not np.isfinite(values).all():
            raise RecordError(f"{name} holds NaN or infinite values")
    if prev.n_prev_actions:
        problem = _window_problem(record.rows[len(signature.state)], pipeline)
        if problem is not None:
            raise RecordError(f"the previous-action window holds {problem}")
    if record.trail is not None:
        problem = trail_problem(record.trail, pipeline.obs_space, pipeline.action_space)
        if problem is not None:
            raise RecordError(f"the experience log's open step does not fit this model: {problem}")


def _window_problem(window: np.ndarray, pipeline: Any) -> str | None:
    """What in the (n, A) window is no previous action of this policy, or None."""
    if getattr(pipeline, "one_hot_actions", False):
        ones = (window == 1.0).sum(axis=-1)
        if not (((window == 0.0) | (window == 1.0)).all() and (ones <= 1).all()):
            return "a row that is neither one-hot nor zeros (this model reads one-hot previous actions)"
        return None
    column = 0
    for space in leaf_spaces(pipeline.action_space):
        width = action_width(space)
        values = window[:, column:column + width]
        column += width
        allowed = _discrete_values(space, width)
        if allowed is None:
            continue  # a Box leaf: the raw sample, any finite value (checked above)
        low, high = allowed
        integral = values == np.round(values)
        fits = integral & (values >= low) & (values < high)  # 0 is also an episode's start
        if not fits.all():
            bad = float(values[~fits].flat[0])
            return f"{bad!r} where {space} takes an integer in [{low.min()}, {high.max()})"
    return None


def _discrete_values(space: Any, width: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(low, high) per column of a discrete leaf's flattened values, in model space (indices
    from 0, whatever the space's ``start``: what ``Pipeline.flatten_actions`` writes); None
    for a Box."""
    if isinstance(space, gs.Discrete):
        return np.zeros(width, np.int64), np.full(width, int(space.n))
    if isinstance(space, gs.MultiDiscrete):
        return np.zeros(width, np.int64), np.asarray(space.nvec, np.int64).reshape(-1)
    if isinstance(space, gs.MultiBinary):
        return np.zeros(width, np.int64), np.full(width, 2)
    return None
