"""Which policy acts for which agent, as data (torch-free).

RLlib keeps the agent-to-policy mapping as a Python function in the training config
(``policy_mapping_fn``), never as data in a checkpoint, so a server must be told it. Here
it is three kinds of rule, tried in this order:

- exact agent ids (``{"player_0": "p0"}``);
- glob patterns, first match wins, in the order given (``[["red_*", "p0"], ["blue_*", "p1"]]``;
  ``*``, ``?`` and ``[...]`` as in ``fnmatch``, case-sensitive);
- a default policy for every other agent (optional: without it an unmatched agent is refused).

The JSON form (a mapping file, the policy set's manifest, the model metadata)::

    {"agents": {"player_0": "p0"}, "patterns": [["red_*", "p0"]], "default": "p1"}

``patterns`` may also be given as an object (``{"red_*": "p0"}``, in its order).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AgentMapping", "MappingError", "UnmappedAgent", "is_pattern"]

_GLOB = re.compile(r"[*?\[]")
_CACHE_LIMIT = 65_536  # resolved agent ids kept (agent ids of a game are few; a flood must not grow it)


class MappingError(ValueError):
    """A mapping that cannot be used: malformed, or naming a policy the set does not have."""


class UnmappedAgent(LookupError):
    """An agent id no rule maps to a policy; the message names the agent and the rules."""

    def __init__(self, agent_id: str, rules: str):
        super().__init__(f"agent {agent_id!r} maps to no policy; the rules are: {rules}")
        self.agent_id = agent_id
        self.rules = rules


def is_pattern(key: str) -> bool:
    """True if ``key`` holds glob characters (a pattern rule), False for an exact agent id."""
    return _GLOB.search(key) is not None


@dataclass
class AgentMapping:
    agents: dict[str, str] = field(default_factory=dict)
    patterns: list[tuple[str, str]] = field(default_factory=list)
    default: str | None = None
    _resolved: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for agent, policy in self.agents.items():
            _check_id(agent, "agent id")
            _check_id(policy, f"policy of agent {agent!r}")
        for pattern, policy in self.patterns:
            _check_id(pattern, "pattern")
            _check_id(policy, f"policy of pattern {pattern!r}")
        if self.default is not None:
            _check_id(self.default, "default policy")
        if not self.agents and not self.patterns and self.default is None:
            raise MappingError("the mapping has no rule: give agent ids, patterns or a default policy")
        self._compiled = [(re.compile(fnmatch.translate(p)), p, policy) for p, policy in self.patterns]

    # ------------------------------------------------------------------ use

    def policy_for(self, agent_id: str) -> str:
        """The policy id acting for ``agent_id``; ``UnmappedAgent`` if no rule applies."""
        found = self._resolved.get(agent_id)
        if found is not None:
            return found
        found = self.agents.get(agent_id)
        if found is None:
            found = next((policy for regex, _, policy in self._compiled if regex.match(agent_id)), self.default)
        if found is None:
            raise UnmappedAgent(agent_id, self.describe())
        if len(self._resolved) < _CACHE_LIMIT:
            self._resolved[agent_id] = found
        return found

    def policy_ids(self) -> set[str]:
        """Every policy a rule names."""
        named = set(self.agents.values()) | {policy for _, policy in self.patterns}
        return named | ({self.default} if self.default is not None else set())

    def check_policies(self, available: Iterable[str]) -> None:
        """Refuse a mapping that names a policy outside ``available``."""
        have = set(available)
        unknown = sorted(self.policy_ids() - have)
        if unknown:
            raise MappingError(f"the mapping names policies {unknown} that the set does not have; "
                               f"its policies are {sorted(have)}")

    def describe(self) -> str:
        """The rules in the order they are tried, for messages and ``rlserve inspect``."""
        parts = [f"{agent!r} -> {policy}" for agent, policy in self.agents.items()]
        parts += [f"{pattern!r} -> {policy}" for pattern, policy in self.patterns]
        parts.append(f"any other agent -> {self.default}" if self.default is not None
                     else "no default (any other agent is refused)")
        return "; ".join(parts)

    # ------------------------------------------------------------------ JSON

    def to_json(self) -> dict[str, Any]:
        return {"agents": dict(self.agents), "patterns": [list(rule) for rule in self.patterns],
                "default": self.default}

    @classmethod
    def from_json(cls, data: Any) -> AgentMapping:
        """The mapping from its JSON form; ``MappingError`` saying what is wrong."""
        if not isinstance(data, Mapping):
            raise MappingError(f"a mapping is a JSON object with 'agents', 'patterns' and 'default', "
                               f"got {type(data).__name__}")
        unknown = sorted(set(data) - {"agents", "patterns", "default"})
        if unknown:
            raise MappingError(f"unknown mapping keys {unknown}; expected 'agents', 'patterns', 'default'")
        agents = data.get("agents") or {}
        if not isinstance(agents, Mapping):
            raise MappingError(f"'agents' must map agent ids to policy ids, got {type(agents).__name__}")
        patterns = _pattern_rules(data.get("patterns") or [])
        default = data.get("default")
        if default is not None and not isinstance(default, str):
            raise MappingError(f"'default' must be a policy id (a string) or null, got {type(default).__name__}")
        return cls(dict(agents), patterns, default)

    @classmethod
    def from_rules(cls, rules: Iterable[tuple[str, str]], default: str | None = None) -> AgentMapping:
        """From ``(agent id or pattern, policy)`` pairs (the command line's ``--map``):
        a key with glob characters is a pattern, any other an exact agent id."""
        agents: dict[str, str] = {}
        patterns: list[tuple[str, str]] = []
        for key, policy in rules:
            if is_pattern(key):
                patterns.append((key, policy))
            else:
                agents[key] = policy
        return cls(agents, patterns, default)


def _pattern_rules(value: Any) -> list[tuple[str, str]]:
    if isinstance(value, Mapping):
        return [(str(k), v) for k, v in value.items()]
    if not isinstance(value, list):
        raise MappingError(f"'patterns' must be a list of [pattern, policy] pairs, got {type(value).__name__}")
    rules = []
    for i, rule in enumerate(value):
        if not (isinstance(rule, list | tuple) and len(rule) == 2):
            raise MappingError(f"patterns[{i}] must be a [pattern, policy] pair, got {rule!r}")
        rules.append((rule[0], rule[1]))
    return rules


def _check_id(value: Any, what: str) -> None:
    if not isinstance(value, str) or not value:
        raise MappingError(f"{what} must be a non-empty string, got {value!r}")
