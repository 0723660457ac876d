"""Event ids: the id each logged step's answer carries, and telling an id no answer carried.

An id is ``<prefix>-<n>``: a random prefix per server process (10 hex digits) and that
process's count of ids given, in hex, so ids are unique across processes and replicas
without asking anyone. A delayed reward names its step by this id
(``rlserve.service.experience.rewards``); one for an id that no answer carried is written
like any other and joins nothing. The process that takes the reward can tell so at once
only in two cases, counted by ``rlserve_experience_rewards_unmatched_total``: the id is not
of this form, or it has this process's prefix and a number it has not given yet. An id of
another process (another worker or replica, this server before a restart) may be a real
step's; ``rlserve experience summary`` joins the whole log and counts every reward that
matched no step.
"""

from __future__ import annotations

import os
import re
import threading

_PREFIX = os.urandom(5).hex()
_FORM = re.compile(r"^([0-9a-f]{10})-([0-9a-f]+)$")
_lock = threading.Lock()  # batches of several models may run in worker threads at once
_given = 0


def new_event_id() -> str:
    global _given
    with _lock:
        _given += 1
        number = _given
    return f"{_PREFIX}-{number:x}"


def never_given(event_id: str) -> bool:
    """True when no answer can have carried ``event_id`` (see the module docstring); False
    when one may have, here or in another process."""
    match = _FORM.match(event_id)
    if match is None:
        return True
    return match[1] == _PREFIX and int(match[2], 16) > _given
