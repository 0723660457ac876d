"""The agent-to-policy mapping as data: exact ids, then patterns in order, then the default."""

from __future__ import annotations

import pytest

from rlserve.models.multiagent.mapping import AgentMapping, MappingError, UnmappedAgent, is_pattern


def test_exact_ids_win_then_the_first_matching_pattern_then_the_default() -> None:
    mapping = AgentMapping({"red_boss": "boss"}, [("red_*", "red"), ("r*", "other"), ("agent_[0-3]", "low")], "rest")
    assert mapping.policy_for("red_boss") == "boss"
    assert mapping.policy_for("red_7") == "red"
    assert mapping.policy_for("rogue") == "other"
    assert mapping.policy_for("agent_2") == "low" and mapping.policy_for("agent_7") == "rest"
    assert mapping.policy_for("Red_1") == "rest"  # case-sensitive
    assert mapping.policy_ids() == {"boss", "red", "other", "low", "rest"}


def test_an_unmapped_agent_names_itself_and_the_rules() -> None:
    mapping = AgentMapping({"player_0": "p0"}, [("blue_*", "p1")])
    with pytest.raises(UnmappedAgent) as caught:
        mapping.policy_for("green_1")
    message = str(caught.value)
    assert "'green_1'" in message and "'player_0' -> p0" in message and "'blue_*' -> p1" in message
    assert "no default" in message and caught.value.agent_id == "green_1"


def test_json_round_trip_and_the_object_form_of_patterns() -> None:
    mapping = AgentMapping({"a": "p0"}, [("x*", "p1"), ("y?", "p0")], "p1")
    assert AgentMapping.from_json(mapping.to_json()) == mapping
    loose = AgentMapping.from_json({"patterns": {"x*": "p1", "y?": "p0"}, "default": "p1", "agents": {"a": "p0"}})
    assert loose == mapping


@pytest.mark.parametrize(("data", "message"), [
    ([], "JSON object"),
    ({}, "no rule"),
    ({"agents": {"a": ""}}, "policy of agent 'a'"),
    ({"agents": ["a"]}, "'agents' must map"),
    ({"patterns": [["x*"]]}, "patterns[0] must be a [pattern, policy] pair"),
    ({"default": 3}, "'default' must be a policy id"),
    ({"agent": {"a": "p"}}, "unknown mapping keys ['agent']"),
])
def test_malformed_mappings_say_what_is_wrong(data, message) -> None:
    with pytest.raises(MappingError, match=message.replace("[", r"\[").replace("]", r"\]")):
        AgentMapping.from_json(data)


def test_rules_from_the_command_line_and_unknown_policies() -> None:
    mapping = AgentMapping.from_rules([("player_0", "p0"), ("red_*", "p1")], "p0")
    assert mapping.agents == {"player_0": "p0"} and mapping.patterns == [("red_*", "p1")]
    assert is_pattern("red_*") and is_pattern("a?") and is_pattern("[ab]") and not is_pattern("red_1")
    with pytest.raises(MappingError, match=r"names policies \['p1'\] that the set does not have"):
        mapping.check_policies(["p0"])
