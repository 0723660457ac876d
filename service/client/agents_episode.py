"""One multi-agent episode as the client keeps it: the agents' rewards logged since their last
step, the agents that finished (with their last observations), each agent's return, and the
agents of the next step built from them. ``AgentsClient``'s episode API (one HTTP request per
step) and ``AgentsStream``'s (one message per step) send the very same steps from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class AgentsEpisode:
    """One episode's bookkeeping on the client: pending rewards, finished agents, returns."""

    episode_id: str
    seed: int | None
    started: bool = False
    pending_rewards: dict[str, float] = field(default_factory=dict)
    # Agents that finished -> what their last step sends besides ``done`` (the last observation).
    finished: dict[str, dict[str, Any]] = field(default_factory=dict)
    returns: dict[str, float] = field(default_factory=dict)

    def step_agents(self, observations: Mapping[str, Any],
                    action_masks: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
        """The next step's agents: those finished since the last step (``done``, their last
        observation), then those acting now, each with the rewards logged since its last step."""
        agents: dict[str, dict[str, Any]] = {}
        for agent, last in self.finished.items():
            agents[agent] = {"done": True, **last, **self._reward(agent)}
        for agent, observation in observations.items():
            step: dict[str, Any] = {"observation": observation, **self._reward(agent)}
            if action_masks is not None and action_masks.get(agent) is not None:
                step["action_mask"] = action_masks[agent]
            agents[agent] = step
        self.finished.clear()
        return agents

    def log_returns(self, rewards: Mapping[str, float]) -> None:
        """Rewards received since the agents' last actions (summed until sent)."""
        for agent, reward in rewards.items():
            self.pending_rewards[agent] = self.pending_rewards.get(agent, 0.0) + float(reward)
            self.returns[agent] = self.returns.get(agent, 0.0) + float(reward)

    def finish(self, agent_ids: Iterable[str], observations: Mapping[str, Any] | None, truncated: bool) -> None:
        """Note finished agents, with their last observations where given."""
        for agent in agent_ids:
            last: dict[str, Any] = {}
            if observations is not None and agent in observations:
                last["observation"] = observations[agent]
                if truncated:
                    last["truncated"] = True
            self.finished[agent] = last

    def last_agents(self, observations: Mapping[str, Any] | None, truncated: bool) -> dict[str, dict[str, Any]]:
        """The episode's last step: every agent with something to send (a last observation, a
        reward) as ``done``; empty when there is nothing left to send."""
        if observations:
            self.finish(observations, observations, truncated)
        return {agent: {"done": True, **self.finished.get(agent, {}), **self._reward(agent)}
                for agent in dict.fromkeys([*self.finished, *self.pending_rewards])}

    def _reward(self, agent: str) -> dict[str, float]:
        reward = self.pending_rewards.pop(agent, None)
        return {} if reward is None else {"reward": reward}
