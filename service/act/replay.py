"""Step indexes: a retried session step is answered again, never applied twice.

A client that got no answer (a timeout, a replica killed mid-request) cannot know whether
its step was applied. With ``"step": k`` (single form: the number of steps this session
has answered in its episode before this one) the server knows:

- the session has answered k steps: the step runs, and its answer is kept with the session
  (in the external store too) for a retry;
- it has answered k + 1 and kept the answer of step k: that answer is sent again, the
  session does not move;
- anything else: 409 naming both counts.

The counts are compared when the batch runs (``rlserve.service.step.batch``), after an
external store brought the session up to date; this module checks the request and builds
the repeated answer.

An ``episode_start`` request is step 0; retrying it restarts the episode again (with a
seed, or ``explore: false``, to the same answer).
"""

from __future__ import annotations

from typing import Any

from rlserve.service.act.wire import ActResponse
from rlserve.service.errors import BadRequest
from rlserve.service.serving.policy import Policy
from rlserve.service.step import codec
from rlserve.service.step.kept import KeptAnswer
from rlserve.service.step.prepare import Step
from rlserve.service.step.rows import Rows


def expected_steps(step: int, rows: Rows) -> int | None:
    """The step count the session must have when the step runs (None at an episode
    start: a restart is retried by running it again); 400 for an index that cannot fit."""
    if not rows.has_sessions:
        raise BadRequest("'step' counts a session's steps: send it with 'session_id'", field="step",
                         expected="a 'session_id' with it", received=step)
    if rows.episode_starts[0]:
        if step != 0:
            raise BadRequest("an episode_start request is step 0 of its episode", field="step", expected=0,
                             received=step)
        return None
    return step


def kept_response(policy: Policy, step: Step, unsquash: bool, clip: bool, kept: KeptAnswer) -> ActResponse:
    """The answer of a step answered before, as the request asks for it now."""
    _, _, logp, value, entropy, dist_inputs = kept.answer
    # The kept action is the raw sample (a float Box's may lie outside its bounds), as
    # ``check_index`` read it: encoded again, so that an imported record's spelling of it
    # (``1.0`` for a Discrete action) is answered as the policy answers, then unsquashed or
    # clipped as this request asks.
    space = policy.pipeline.action_space
    raw_action = codec.encode_batch(space, kept.raw_actions)[0]
    action = raw_action
    if unsquash or clip:
        actions: Any = kept.raw_actions
        if unsquash:
            actions = policy.pipeline.unsquash(actions)
        if clip:
            actions = policy.pipeline.clip(actions)
        action = codec.encode_batch(space, actions)[0]
    response = ActResponse(model=policy.name, version=policy.version, explore=step.explore, logp=logp,
                           action=action, session_id=kept.session.id)
    if "value" in step.extras and value is not None:
        response.value = value
    if "entropy" in step.extras:
        response.entropy = entropy
    if "dist_inputs" in step.extras and dist_inputs is not None:
        response.dist_inputs = dist_inputs
    if "q_values" in step.extras and dist_inputs is not None:  # a Q-policy's dist_inputs
        response.q_values = dist_inputs
    if "raw_action" in step.extras:
        response.raw_action = raw_action
    return response
