"""A policy set's answer as the client reads it (``AgentsClient.act``, ``AgentsStream.step``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["AgentsResult"]


@dataclass
class AgentsResult:
    """One answer: per agent its action, and the policy that answered."""

    raw: dict[str, Any]

    @property
    def actions(self) -> dict[str, Any]:
        """Each acting agent's action, in its action space's JSON structure (finished agents have none)."""
        return {agent: answer["action"] for agent, answer in self.raw["agents"].items() if "action" in answer}

    @property
    def policies(self) -> dict[str, str]:
        """Which policy of the set answered each agent of the request."""
        return {agent: answer["policy"] for agent, answer in self.raw["agents"].items()}

    def agent(self, agent_id: str) -> dict[str, Any]:
        """The whole answer of one agent: ``policy``, ``action``, ``logp`` and the extras asked for."""
        return self.raw["agents"][agent_id]


