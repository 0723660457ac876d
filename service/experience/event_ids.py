"""Event ids: the id each logged step's answer carries, and telling an id no answer carried.

An id is ``<prefix>-<n>``: a random prefix per server process (10 hex digits) and a number
that process takes once (``NUMBERS``), in hex (the recorder spells it ``f"{PREFIX}-{n:x}"``),
so ids are unique across processes and replicas without asking anyone. A delayed reward names its step by this id
(``rlserve.service.experience.rewards``); one for an id that no answer carried is written
like any other and joins nothing. The process that takes the reward can tell so at once
only in two cases, counted by ``rlserve_experience_rewards_unmatched_total``: the id is not
of this form, or it has this process's prefix and a number it has not given yet. An id of
another process (another worker or replica, this server before a restart) may be a real
step's; ``rlserve experience summary`` joins the whole log and counts every reward that
matched no step.
"""

from __future__ import annotations

import itertools
import os
import re
import threading

PREFIX = os.urandom(5).hex()
# The numbers, in the order they are taken: ``next`` is one call into C, atomic under the
# interpreter lock, so batches of several models in worker threads at once need no lock per id.
NUMBERS = itertools.count(1)
_FORM = re.compile(r"^([0-9a-f]{10})-([0-9a-f]+)$")
_lock = threading.Lock()
_given = 0  # the highest number an answer may carry (``given``)


def given(number: int) -> None:
    """Answers may carry the ids up to ``number`` from now on: called by the recorder once per
    batch, with its last number, before the batch's answers go out."""
    global _given
    with _lock:
        if number > _given:
            _given = number


def never_given(event_id: str) -> bool:
    """True when no answer can have carried ``event_id`` (see the module docstring); False
    when one may have, here or in another process."""
    match = _FORM.match(event_id)
    if match is None:
        return True
    return match[1] == PREFIX and int(match[2], 16) > _given
