"""What an act request may ask for besides the action (``outputs``), and the answer's fields
that carry it.

``Extra`` names them: the JSON request's ``outputs`` (``rlserve.service.act.wire``), the raw
body's ``X-Rlserve-Outputs`` header (``rlserve.service.act.binary``) and a policy set's
request (``rlserve.service.multiagent.wire``). ``ExtraOutputs`` declares their answer fields
once, for the act answer (``ActResponse``) and a policy set's per-agent answer
(``AgentAnswer``), which both extend it: a field added here is documented and sent by both.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import msgspec

Extra = Literal["value", "entropy", "dist_inputs", "q_values", "raw_action"]
EXTRA_NAMES: tuple[str, ...] = get_args(Extra)


class ExtraOutputs(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The outputs asked for by name in ``outputs``, one field each (unset when not asked;
    single form: a value, null where the distribution defines none; batch form: a list
    with one entry per row)."""

    value: Any = msgspec.UNSET
    entropy: Any = msgspec.UNSET
    dist_inputs: Any = msgspec.UNSET
    # A Q-policy's Q-values (after masking), one per action. Only with ``outputs: ["q_values"]``.
    q_values: Any = msgspec.UNSET
    # The model's own sample (before unsquash/clip): what a recurrent model is fed back as
    # its previous action. Only with ``outputs: ["raw_action"]``.
    raw_action: Any = msgspec.UNSET
