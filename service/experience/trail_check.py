"""Whether a session record's open step (``trail``) is one this model could have logged.

The recorder writes a trail when it answers a logged step and reads it back when the next
step closes the transition; the writer then stacks many transitions into one table per
model. A trail that came in with an imported record is checked here first: a packed value
of the wrong size, an action no action space holds, or a value that has no JSON form would
otherwise fail the table of a whole batch of transitions, other sessions' with it.
"""

from __future__ import annotations

import json
from typing import Any

from gymnasium import spaces as gs

from rlserve.service.experience import trail as trails
from rlserve.service.experience.records import value_bytes

MAX_T = 1 << 62


def trail_problem(data: Any, obs_space: Any, action_space: Any) -> str | None:
    """What in ``data`` (a record's trail bytes) does not fit, or None. Bytes that are no
    trail at all are fine: the recorder does not read them (the episode's next transition
    goes unlogged), so they reach no table."""
    trail = trails.decode(data)
    if trail is None:
        return None
    if not 0 <= trail.t <= MAX_T:
        return f"its step index {trail.t} is not in 0..2**62"
    for name, value, space in (("observation", trail.obs, obs_space), ("action", trail.action, action_space),
                               ("environment action", trail.env_action, action_space)):
        if value is None and name == "environment action":
            continue  # equal to the action
        problem = _packed_problem(value, space)
        if problem is not None:
            return f"its {name} {problem}"
    return None


def _packed_problem(value: Any, space: Any) -> str | None:
    """How ``value`` differs from what ``records.packer(space)`` keeps, or None."""
    if isinstance(space, gs.Box | gs.MultiDiscrete | gs.MultiBinary):
        size = value_bytes(space)  # the packer's raw bytes: the Box's dtype, int64 for the others
        if not isinstance(value, bytes) or len(value) != size:
            got = f"{len(value)} bytes" if isinstance(value, bytes) else type(value).__name__
            return f"is {got}, not the {size} bytes of a {space} value"
        return None
    if isinstance(space, gs.Discrete):
        if type(value) is not int or not -(1 << 63) <= value < (1 << 63):
            return f"is {value!r}, not an integer of {space}"
        return None
    try:  # a composite space's value is logged as its JSON text (a decoded trail holds no numpy)
        json.dumps(value)
    except (TypeError, ValueError, RecursionError) as exc:
        return f"has no JSON form ({exc})"
    return None
