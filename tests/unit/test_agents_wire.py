"""A policy set's act request refused at decoding names the agent whose step is wrong.

msgspec elides an object's key in its error path (``$.agents[...].reward``); the refusal
must name the agent that sent the bad value, not the first agent that has the field.
"""

from __future__ import annotations

import json

import pytest

from rlserve.service.errors import BadRequest
from rlserve.service.multiagent.wire import decode_agents_request

GOOD = {"observation": [0.1, 0.2], "reward": 1.0, "done": False}


@pytest.mark.parametrize(("field", "bad", "received"), [
    ("reward", "high", "high"),
    ("reward", [1.0], None),
    ("reward", "1e999", "1e999"),  # raw text: a number out of range
    ("done", "yes", "yes"),
    ("done", 1, 1),
    ("truncated", None, None),
])
@pytest.mark.parametrize("position", [0, 1, 2])
def test_the_refusal_names_the_agent_that_sent_the_bad_value(field, bad, received, position):
    agents = {name: dict(GOOD, truncated=False) for name in ("boss", "red_1", "blue_1")}
    culprit = list(agents)[position]
    agents[culprit][field] = "@@BAD@@"
    bad_text = bad if bad == "1e999" else json.dumps(bad)
    body = json.dumps({"agents": agents}).replace('"@@BAD@@"', bad_text).encode()
    with pytest.raises(BadRequest) as refused:
        decode_agents_request(body)
    assert refused.value.field == f"agents.{culprit}.{field}"
    assert f"agents.{culprit}.{field}" in refused.value.message
    if received is not None:
        assert refused.value.received == received


@pytest.mark.parametrize(("seed", "expected"), [
    ('"7"', "int | null"), ("1.5", "int | null"), ("-1", "int >= 0"), (str(1 << 70), "int <= 18446744073709551615"),
])
def test_a_seed_that_is_no_seed_is_refused_by_name(seed, expected):
    body = b'{"seed": %s, "agents": {"boss": {"observation": [0.1, 0.2]}}}' % seed.encode()
    with pytest.raises(BadRequest) as refused:
        decode_agents_request(body)
    assert refused.value.field == "seed" and refused.value.expected.replace("`", "") == expected
