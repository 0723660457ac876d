"""The client side of the experience log's end-to-end tests: gymnasium episodes played
through ``PolicyClient`` step by step, with everything the client sent and was answered
kept, so the log can be compared with it transition by transition."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlserve.client.envs import DEFAULT_POLICY_ENVS, make_env
from rlserve.client.policy_client import PolicyClient
from rlserve.service.experience import reader


@dataclass
class Played:
    """One episode as the client saw it: per step the observation sent and the answer."""

    model: str
    session: str
    observations: list[list[float]] = field(default_factory=list)  # T+1 (the last one ended it)
    actions: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    event_ids: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    end: str = ""  # "terminated" or "truncated"
    servers: list[int] = field(default_factory=list)  # which replica answered each request

    def __len__(self) -> int:
        return len(self.actions)


class Episode:
    """An episode in progress: ``step(client)`` sends its next request."""

    def __init__(self, model: str, session: str, seed: int, max_steps: int, *, tight: bool = False):
        self.env = make_env(DEFAULT_POLICY_ENVS[model])
        if tight:  # the pole may lean 0.01 rad: the policies' wobble ends the episode within a few steps
            self.env.unwrapped.theta_threshold_radians = 0.01  # type: ignore[attr-defined]
        self.played = Played(model, session)
        self.seed, self.max_steps = seed, max_steps
        obs, _ = self.env.reset(seed=seed)
        self.obs = np.asarray(obs, np.float32).tolist()
        self.t = 0
        self.done = False

    def step(self, client: PolicyClient, server: int = 0) -> None:
        played, t = self.played, self.t
        extra: dict[str, Any] = {"step": t}
        if t == 0:
            extra.update(episode_start=True, seed=self.seed)
        else:
            extra["reward"] = played.rewards[-1]
        if played.end:
            extra[played.end] = True
        answer = client.act(self.obs, session_id=played.session, explore=True, **extra)
        played.observations.append(self.obs)
        played.servers.append(server)
        self.t += 1
        if played.end:  # the last observation's answer is not a step of the episode
            assert "event_id" not in answer.raw, answer.raw
            self.done = True
            self.env.close()
            return
        played.actions.append(int(answer.action))
        played.logps.append(float(answer.logp))
        played.event_ids.append(answer.raw["event_id"])
        obs, reward, terminated, truncated, _ = self.env.step(answer.action)
        self.obs = np.asarray(obs, np.float32).tolist()
        played.rewards.append(float(reward))
        if terminated or truncated or len(played) == self.max_steps:
            played.end = "terminated" if terminated else "truncated"


def play_all(episodes: list[Episode], client_for: Callable[[Episode], tuple[PolicyClient, int]],
             pause: Callable[[int], None] | None = None) -> list[Played]:
    """Step every episode in lock-step rounds until all ended; ``pause(round)`` runs
    between rounds (no request in flight then)."""
    rounds = 0
    while not all(e.done for e in episodes):
        for episode in episodes:
            if not episode.done:
                client, server = client_for(episode)
                episode.step(client, server)
        rounds += 1
        if pause is not None:
            pause(rounds)
    return [e.played for e in episodes]


def assert_logged_exactly(log: Path, played: list[Played]) -> None:
    """Every transition of every played episode is in the columns form, exactly, in order,
    once; and the episodes form joins into the same whole episodes."""
    for model in {p.model for p in played}:
        mine = [p for p in played if p.model == model]
        table = reader.transitions(log, model)
        assert table is not None, f"nothing logged for {model}"
        rows = table.to_pylist()
        by_event = {row["infos"]["event_id"]: row for row in rows}
        assert len(by_event) == len(rows) == sum(len(p) for p in mine), "a transition missing or twice"
        for p in mine:
            episode_rows = [by_event[e] for e in p.event_ids]
            assert len({r["eps_id"] for r in episode_rows}) == 1, "one episode, one eps_id"
            for t, row in enumerate(episode_rows):
                assert row["t"] == t
                assert row["obs"] == p.observations[t] and row["new_obs"] == p.observations[t + 1]
                assert row["actions"] == p.actions[t]
                assert row["action_logp"] == np.float32(p.logps[t])
                assert row["rewards"] == p.rewards[t]
                last = t == len(p) - 1
                assert (row["terminateds"], row["truncateds"]) == (
                    last and p.end == "terminated", last and p.end == "truncated")
        episodes = {e.eps_id: e for e in reader.episodes(log, model)}
        assert len(episodes) == len(mine), "each episode joins into one unbroken run"
        for p in mine:
            episode = episodes[by_event[p.event_ids[0]]["eps_id"]]
            assert episode.whole and len(episode) == len(p)
            assert np.array_equal(np.asarray(episode.observations), np.asarray(p.observations, np.float32))
            assert [int(a) for a in episode.actions] == p.actions
            assert episode.rewards == p.rewards
            assert np.array_equal(np.asarray(episode.action_logp, np.float32), np.asarray(p.logps, np.float32))
            assert episode.is_terminated == (p.end == "terminated")
