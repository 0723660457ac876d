"""The outputs a request asks for by name (``rlserve.service.act.outputs``): one name list,
one declaration of their answer fields, used by the act answer and a policy set's."""

from __future__ import annotations

import msgspec

from rlserve.service.act.outputs import EXTRA_NAMES, ExtraOutputs
from rlserve.service.act.wire import ActResponse
from rlserve.service.multiagent.wire import AgentAnswer


def test_each_output_name_is_one_answer_field_of_both_answers():
    assert ExtraOutputs.__struct_fields__ == EXTRA_NAMES
    for answer in (ActResponse, AgentAnswer):
        assert issubclass(answer, ExtraOutputs) and set(EXTRA_NAMES) <= set(answer.__struct_fields__)


def test_an_answer_starts_with_what_it_is_about():
    plain = ActResponse(model="m", version="1", explore=False, action=1, logp=-0.5, session_id="s")
    assert msgspec.json.encode(plain) == b'{"model":"m","version":"1","explore":false,"action":1,"logp":-0.5,' \
                                         b'"session_id":"s"}'
    asked = ActResponse(model="m", version="1", explore=False, action=1, logp=-0.5, value=2.0)
    assert list(msgspec.json.decode(msgspec.json.encode(asked))) == ["model", "version", "explore", "action", "value",
                                                                      "logp"]
    assert AgentAnswer.__struct_fields__[:3] == ("policy", "action", "logp")
