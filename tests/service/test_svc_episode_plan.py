"""What one policy-set request does to its episode (``EpisodePlan``), driven without HTTP:
nothing changes while the plan is made, ``bind`` applies it, ``settle`` ends what the step
ended; agents' sessions are those of the member models' session lifecycles."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from rlserve.models.export.policy_set_export import policy_set_from_bundles
from rlserve.models.multiagent.mapping import AgentMapping
from rlserve.service.app import create_app
from rlserve.service.errors import SessionExpired, SessionNotFound
from rlserve.service.multiagent.episode_plan import derive_seed, plan_episode
from rlserve.service.multiagent.wire import decode_agents_request
from rlserve.service.sessions.episode_store import agent_session_id
from rlserve.service.settings import Settings


@pytest.fixture(scope="module")
def duo_set(bundle_store, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plan-sets") / "duo"
    mapping = AgentMapping({}, [("a_*", "left"), ("b_*", "right")], None)
    with policy_set_from_bundles({"left": bundle_store / "lstm", "right": bundle_store / "mlp"}, out, mapping,
                                 name="duo"):
        pass
    return out


@pytest.fixture
def registry(duo_set):
    return create_app(Settings(policy_sets=[str(duo_set)])).state.registry


def _request(**body):
    body.setdefault("agents", {"a_1": {"observation": [0.0] * 4}})  # the plan reads the envelope only
    return decode_agents_request(json.dumps(body).encode())


def _start(registry, served, episode_id: str, agents: list[str], seed: int | None = 11):
    """Plan and bind an episode's first step, seating ``agents`` with sessions as a served step would."""
    plan = plan_episode(served, _request(episode_id=episode_id, episode_start=True, seed=seed))
    for agent in agents:
        policy = served.mapping.policy_for(agent)
        session_id, starts, agent_seed = plan.seat(agent, policy)
        assert starts
        entry = registry.entry(served.member(policy))
        asyncio.run(entry.sessions.open(session_id, entry.current, agent_seed))
    plan.bind(registry)
    plan.settle(registry, ended=False)
    return plan


def _session(registry, served, policy: str, session_id: str):
    return registry.entry(served.member(policy)).sessions.find(session_id)


def test_planning_changes_nothing_until_bind(registry) -> None:
    served = registry.policy_set("duo")
    plan = plan_episode(served, _request(episode_id="e1", episode_start=True, seed=5))
    assert plan.stateful and plan.episode is None and plan.policy_of("a_1") is None
    session_id, starts, seed = plan.seat("a_1", "left")
    assert (session_id, starts) == (agent_session_id("e1", "a_1"), True)
    assert seed == derive_seed(5, "a_1", 1)  # the same in every process: episode seed, agent, joins
    assert served.episodes.live("e1") is None  # a refused part after this leaves no episode behind
    plan.bind(registry)
    episode = served.episodes.live("e1")
    assert episode is not None and set(episode.seats) == {"a_1"} and served.episodes.in_flight("e1")
    plan.settle(registry, ended=False)
    assert not served.episodes.in_flight("e1") and episode.steps == 1


def test_a_stateless_request_has_no_episode(registry) -> None:
    served = registry.policy_set("duo")
    plan = plan_episode(served, _request())
    assert not plan.stateful and plan.seat("a_1", "left") == (None, False, None)
    plan.bind(registry)
    assert plan.settle(registry, ended=False) is None and len(served.episodes) == 0


def test_a_seated_agent_keeps_its_policy_and_session(registry) -> None:
    served = registry.policy_set("duo")
    _start(registry, served, "e2", ["a_1", "b_1"])
    plan = plan_episode(served, _request(episode_id="e2"))
    assert plan.policy_of("a_1") == "left" and plan.policy_of("b_1") == "right" and plan.policy_of("a_9") is None
    assert plan.seat("a_1", "left") == (agent_session_id("e2", "a_1"), False, None)


def test_a_finishing_agent_leaves_and_its_state_ends_at_bind(registry) -> None:
    served = registry.policy_set("duo")
    _start(registry, served, "e3", ["a_1", "b_1"])
    plan = plan_episode(served, _request(episode_id="e3"))
    plan.finish("b_1")
    plan.finish("b_7")  # never seated: nothing to end
    plan.check_finishing(registry)  # in process: nothing to read first
    assert _session(registry, served, "right", agent_session_id("e3", "b_1")).inflight == 0
    plan.bind(registry)
    assert set(served.episodes.live("e3").seats) == {"a_1"}
    with pytest.raises(SessionExpired):
        _session(registry, served, "right", agent_session_id("e3", "b_1"))
    plan.settle(registry, ended=False)


def test_a_closing_agent_ends_only_once_answered(registry) -> None:
    served = registry.policy_set("duo")
    _start(registry, served, "e4", ["a_1", "a_2"])
    for answered in (False, True):
        plan = plan_episode(served, _request(episode_id="e4"))
        plan.close_after("a_2")
        plan.bind(registry)
        plan.settle(registry, ended=False, answered=answered)
        seated = set(served.episodes.live("e4").seats)
        assert seated == ({"a_1"} if answered else {"a_1", "a_2"})


def test_a_restart_ends_agents_that_do_not_rejoin_and_keeps_the_seed_salt(registry) -> None:
    served = registry.policy_set("duo")
    _start(registry, served, "e5", ["a_1", "b_1"], seed=3)
    plan = plan_episode(served, _request(episode_id="e5", episode_start=True))
    assert plan.restart and plan.seed == 3 and plan.policy_of("a_1") is None  # every agent starts again
    session_id, starts, seed = plan.seat("a_1", "left")
    assert starts and seed == derive_seed(3, "a_1", 2)  # its second join in this seed's episode
    plan.bind(registry)
    assert set(served.episodes.live("e5").seats) == {"a_1"}
    assert _session(registry, served, "left", session_id).id == session_id  # rejoined: its session kept
    with pytest.raises(SessionExpired):
        _session(registry, served, "right", agent_session_id("e5", "b_1"))
    plan.settle(registry, ended=False)


def test_the_end_ends_every_agent_and_the_episode(registry) -> None:
    served = registry.policy_set("duo")
    _start(registry, served, "e6", ["a_1", "b_1"])
    plan = plan_episode(served, _request(episode_id="e6"))
    plan.bind(registry)
    assert plan.settle(registry, ended=True) is None and plan.ended
    for policy, agent in (("left", "a_1"), ("right", "b_1")):
        with pytest.raises(SessionExpired):
            _session(registry, served, policy, agent_session_id("e6", agent))
    with pytest.raises(SessionExpired):
        plan_episode(served, _request(episode_id="e6"))
    with pytest.raises(SessionNotFound):
        plan_episode(served, _request(episode_id="never"))
