"""A step's answer kept in its session, so that a retried step is answered again.

An act request may say which step of its episode it is (``step``): the batch then keeps
each row's answer in its session (``pack_answer``, msgpack of [step index, action, logp,
value, entropy, dist_inputs]), and a request for the step just answered gets that answer
back instead of a second step (``check_index``: the kept answer, a 409, or None to run it).
The bytes travel in the session's record (``rlserve.service.sessions.record``), so an
imported record may hold anything there: what is not a kept answer of this policy (an
action it could have sampled, numbers where numbers go) is never replayed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from rlserve.service.errors import ServiceError, SessionConflict
from rlserve.service.sessions.record import MAX_STEPS
from rlserve.service.sessions.store import Session
from rlserve.service.step.output import DIST_INPUT_NAMES, StepOutput
from rlserve.service.step.prepare import Step


@dataclass(slots=True)
class KeptAnswer:
    """A retried step's kept answer, sent again; the session did not move."""

    session: Session
    answer: list[Any]  # as ``pack_answer`` wrote it
    raw_actions: Any  # its action read as the raw sample it was: a model-space batch of one


_KEPT = msgspec.msgpack.Decoder(list)


def check_index(step: Step, read_action: Callable[[Any], Any], dist_width: int) -> KeptAnswer | ServiceError | None:
    """None: the session has answered exactly ``expect_steps`` steps, run it. The kept
    answer when this step was answered already (``read_action``: the policy's reading of a
    raw sampled JSON action, raising ValueError for one it could not have sampled;
    ``dist_width``: its dist_inputs' width); else 409 naming both counts. Checked
    here, when the batch runs, because only now is the copy of the session the latest
    (an external store's ``validate`` ran) and earlier steps of a pipelining client done."""
    session = step.sessions[0]
    expected = step.expect_steps
    assert session is not None and expected is not None  # set only for a single session row
    if session.steps >= MAX_STEPS:
        # A record keeps at most MAX_STEPS: past it, a count read back (another replica, a
        # restart, an import) may be short of the real one, and a retry could run twice.
        return SessionConflict(
            f"session {session.id!r} has answered {MAX_STEPS} or more steps of this episode, more than its record "
            "counts: steps can no longer be checked; start a new episode (or send no 'step')", field="step",
            expected=f"a session that has answered fewer than {MAX_STEPS} steps", received=expected)
    if session.steps == expected:
        return None
    if session.steps == expected + 1 and session.answer is not None:
        kept = _kept(session.answer, read_action, dist_width)
        if kept is not None and kept[0][0] == expected:
            return KeptAnswer(session, *kept)
    return SessionConflict(
        f"session {session.id!r} has answered {session.steps} steps of this episode; this request says it is step "
        f"{expected}", field="step", expected=session.steps, received=expected)


def _kept(data: bytes, read_action: Callable[[Any], Any], dist_width: int) -> tuple[list[Any], Any] | None:
    """A kept answer (``pack_answer``) and its action as ``read_action`` read it; None for
    bytes that are none (an imported record's): not msgpack, not [index, action, logp,
    value, entropy, dist_inputs], an action the policy reads as none of its actions, or
    anything after it but numbers (dist_inputs: ``dist_width`` of them)."""
    try:
        answer = _KEPT.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    if len(answer) != 6 or type(answer[0]) is not int or not all(_number(x) for x in answer[2:5]):
        return None
    dist_inputs = answer[5]
    if dist_inputs is not None and not (type(dist_inputs) is list and len(dist_inputs) == dist_width
                                        and all(_number(x) for x in dist_inputs)):
        return None
    try:
        return answer, read_action(answer[1])
    except (ValueError, TypeError):
        return None


def _number(value: Any) -> bool:
    """A JSON number, or null (where the first answer had no value, or a NaN)."""
    return value is None or type(value) in (int, float)


_ANSWERS = msgspec.msgpack.Encoder()


def pack_answer(step_index: int, result: StepOutput, offset: int, extras: frozenset[str]) -> bytes:
    """One row's answer, kept for a retry: [step index, action, logp, value, entropy,
    dist_inputs] (the JSON values the response was built from; None where not computed
    or not asked for; a Q-policy's q_values are its dist_inputs)."""
    batch, row = result.batch, result.start + offset

    def pick(values: list[Any] | None, *names: str) -> Any:
        return None if values is None or (names and extras.isdisjoint(names)) else values[row]

    return _ANSWERS.encode([step_index, batch.actions_json[row], pick(batch.logp), pick(batch.value, "value"),
                            pick(batch.entropy, "entropy"), pick(batch.dist_inputs, *DIST_INPUT_NAMES)])
