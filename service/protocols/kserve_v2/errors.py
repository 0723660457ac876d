"""Refusals in the protocol's shape: ``{"error": "<message>"}`` and its status codes.

The protocol names one error object with a message and "an HTTP error status (typically
400)"; Triton answers 404 for what it cannot find, 503 when unavailable, 500 for internal
errors and 400 for everything else the client got wrong. rlserve's errors keep that
split: 404 (unknown model, version or sequence), 405, 413 (body over the limit), 500, 503
(queue full, with Retry-After) as they are; every other 4xx (409 session conflicts, 410
ended sequences, 422 inputs outside the spaces) is a 400. The message still names the
tensor or parameter and says what was expected and what was received: the JSON API's
field names (``observations[3]``, ``session_id``) become the protocol's (``obs`` row 3,
``parameters.sequence_id``).
"""

from __future__ import annotations

import re
from typing import Any

from rlserve.service.errors import ErrorCounter, ServiceError
from rlserve.service.protocols.kserve_v2.layout import MASK, OBS, PREV_ACTION, REWARD
from rlserve.service.protocols.kserve_v2.wire import ENCODER, InferErrorResponse

_KEPT = frozenset({404, 405, 413})
_FIELD = re.compile(r"^(?P<base>observations?|action_masks?|prev_actions?|rewards?|session_ids?|seeds?|epsilon)"
                    r"(?:\[(?P<row>\d+)\])?(?P<rest>.*)$", re.S)
_NAMES = {"observation": OBS, "action_mask": MASK, "prev_action": PREV_ACTION, "reward": REWARD,
          "session_id": "parameters.sequence_id", "seed": "parameters.seed", "epsilon": "parameters.epsilon"}
# Session messages speak of the JSON API's sessions and fields; here they are sequences.
_SEQUENCE_WORDS = (("start a new episode", "start it again with sequence_start=true"),
                   ("episode_start=true", "sequence_start=true"), ("episode_start", "sequence_start"),
                   ("session '", "sequence '"), ("unknown session", "unknown sequence"),
                   ("steps of this episode", "steps of this sequence"),
                   ("this request says it is step", "its parameters.step says it is step"))
_MAX_PART = 300


def status_of(error: ServiceError) -> int:
    status = error.status
    if status >= 500 or status in _KEPT or status < 400:
        return status
    return 400


def _protocol_name(field: str) -> str | None:
    match = _FIELD.match(field)
    if match is None:
        return None
    base = match["base"]
    name = _NAMES.get(base) or _NAMES[base[:-1]]  # the single and the batch form
    rest = match["rest"]
    row = f" row {match['row']}" if match["row"] is not None else ""
    if rest.startswith(".") and name == OBS:  # observations[3].action_mask -> obs.action_mask row 3
        return f"'{name}{rest}'{row}"
    return f"'{name}'{row}{rest}"


def _part(value: Any) -> str:
    text = ENCODER.encode(value).decode()
    return text if len(text) <= _MAX_PART else text[:_MAX_PART - 3] + "..."


def message_of(error: ServiceError) -> str:
    """The error's message in the protocol's names, with what was expected and received."""
    described = error.to_json()["error"]  # every part made encodable, whatever it holds
    message, field = described["message"], described["field"]
    if field and message.startswith(f"{field}:"):
        # The JSON API's names become the protocol's; a tensor's own name is quoted.
        message = (_protocol_name(field) or f"'{field}'") + message[len(field):]
    if field is not None and (field.startswith("session_id") or field == "step"):
        for json_api, protocol in _SEQUENCE_WORDS:
            message = message.replace(json_api, protocol)
    details = []
    if described["expected"] is not None:
        details.append(f"expected {_part(described['expected'])}")
    if described["received"] is not None:
        details.append(f"received {_part(described['received'])}")
    return f"{message} ({'; '.join(details)})" if details else message


def error_body(error: ServiceError) -> bytes:
    return ENCODER.encode(InferErrorResponse(message_of(error)))


def error_reply(
    error: ServiceError, counter: ErrorCounter | None = None
) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """(status, ``{"error": ...}`` body, headers besides content-type), counted under the
    error's own code and the status sent."""
    status = status_of(error)
    if counter is not None:
        counter.error(error.code, status)
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in error.headers.items()]
    return status, error_body(error), headers
