"""The act request's rules that JSON Schema cannot state, taught to schemathesis.

The OpenAPI document states what a schema can (exactly one of ``observation`` /
``observations``, each form's fields, id lengths; ``rlserve.service.api.act``). Two rules relate
values inside one request and have no JSON Schema keyword: in the batch form each column
(``session_ids``, ``rewards``, ...) has one entry per observation, and a session appears at
most once. The server answers a request that breaks them with 400, as documented in the
fields' descriptions; so that the ``positive_data_acceptance`` check can hold the server
to everything else, this hook makes each *positive* act case obey them (negative cases are
left alone: the server must reject those however they were generated).
"""

from __future__ import annotations

from typing import Any

import schemathesis

# Each batch-form column and a value that is valid for any row of it.
_COLUMNS = {"session_ids": None, "episode_starts": False, "rewards": None, "prev_actions": None,
            "action_masks": None, "seeds": None}


@schemathesis.hook
def map_case(context: Any, case: Any) -> Any:
    body = case.body
    meta = case.meta
    if (not case.path.endswith("/act") or meta is None or not meta.generation.mode.is_positive
            or not isinstance(body, dict) or not isinstance(body.get("observations"), list)):
        return case
    rows = len(body["observations"])
    for column, filler in _COLUMNS.items():
        values = body.get(column)
        if isinstance(values, list):
            body[column] = (values + [filler] * rows)[:rows]
    ids = body.get("session_ids")
    if isinstance(ids, list):
        seen: set[str] = set()
        for row, session_id in enumerate(ids):
            if session_id in seen:
                ids[row] = None
            elif session_id is not None:
                seen.add(session_id)
    return case
