"""The Python client against a real `rlserve serve` process serving the embedded policies."""

from __future__ import annotations

import asyncio
import math

import pytest
from server_process import running_server

from rlserve.client.policy_client import (
    ActResult,
    AllActionsMaskedError,
    AsyncPolicyClient,
    InvalidInputError,
    ModelNotFoundError,
    OverloadedError,
    PolicyClient,
    RLServeError,
    SessionExpiredError,
    SessionNotFoundError,
)

pytestmark = pytest.mark.e2e

CARTPOLE_OBS = [0.01, -0.02, 0.03, 0.04]


@pytest.fixture(scope="module")
def url():
    with running_server() as base:
        yield base


def test_act_single_and_batch(url):
    with PolicyClient(url, "cartpole") as client:
        one = client.act(CARTPOLE_OBS, explore=False, outputs=["value", "entropy"])
        assert isinstance(one, ActResult) and one.action in (0, 1)
        assert one.logp is not None and one.logp <= 0.0 and math.isfinite(one.value)
        batch = client.act_batch([CARTPOLE_OBS, [0.0, 0.5, -0.2, -1.0]], explore=False)
        assert len(batch.actions) == 2 and len(batch.logps) == 2
        # The same observation gives the same greedy action alone or in a batch.
        assert batch.actions[0] == one.action


def test_episode_api_keeps_state_and_ends(url):
    with PolicyClient(url, "cartpole-memory", explore=False) as client:
        episode = client.start_episode(seed=3)
        first = client.get_action(episode, [0.0, 0.0])
        client.log_returns(episode, 1.0)
        client.log_returns(episode, 0.5)
        second = client.get_action(episode, [0.0, 0.0])
        assert first in (0, 1) and second in (0, 1)
        total = client.end_episode(episode)
        assert total == pytest.approx(1.5)
        # The server session is gone: using its id again is a typed 410, not a new session.
        with pytest.raises(SessionExpiredError) as info:
            client.act([0.0, 0.0], session_id=episode)
        assert info.value.status == 410
        with pytest.raises(SessionNotFoundError):
            client.get_action(episode, [0.0, 0.0])  # not open in this client any more


def test_memory_state_changes_actions_over_an_episode(url):
    """The same observation repeated: an LSTM's outputs move as its server-side state evolves."""
    with PolicyClient(url, "cartpole-memory", explore=False) as client:
        client.create_session("memory-probe")
        values = [client.act([0.02, 0.05], session_id="memory-probe", outputs=["value"]).value for _ in range(4)]
        fresh = client.act([0.02, 0.05], outputs=["value"]).value
        assert values[0] == pytest.approx(fresh, rel=1e-5)
        assert max(abs(v - values[0]) for v in values[1:]) > 1e-4


def test_typed_errors(url):
    with PolicyClient(url, "no-such-model") as client, pytest.raises(ModelNotFoundError) as missing:
        client.act(CARTPOLE_OBS)
    assert missing.value.status == 404
    with PolicyClient(url, "cartpole") as client:
        with pytest.raises(InvalidInputError) as bad:
            client.act([0.1, 0.2])  # CartPole observations have 4 entries
        assert bad.value.status == 422 and bad.value.field and bad.value.received is not None
        with pytest.raises(AllActionsMaskedError):
            client.act(CARTPOLE_OBS, action_mask=[0, 0])
        masked = {client.act(CARTPOLE_OBS, action_mask=[0, 1], explore=True).action for _ in range(20)}
        assert masked == {1}


def test_async_client_concurrent_sessions(url):
    async def play() -> list[int]:
        async with AsyncPolicyClient(url, "cartpole-memory", explore=False) as client:
            episodes = [await client.start_episode(seed=i) for i in range(8)]
            actions = await asyncio.gather(*(client.get_action(e, [0.01 * i, 0.0]) for i, e in enumerate(episodes)))
            for e in episodes:
                await client.end_episode(e)
            return list(actions)

    actions = asyncio.run(play())
    assert len(actions) == 8 and set(actions) <= {0, 1}


def test_queue_full_is_retried_only_when_asked():
    """A 503 queue_full was refused before touching any session, so the client may repeat it."""
    env = {"RLSERVE_QUEUE_LIMIT": "1", "RLSERVE_MAX_BATCH_DELAY_MS": "200", "RLSERVE_RETRY_AFTER_S": "1"}
    with running_server(env=env) as base:

        async def burst(max_retries: int) -> list[object]:
            async with AsyncPolicyClient(base, "cartpole", max_retries=max_retries) as client:
                calls = [client.act(CARTPOLE_OBS, explore=False) for _ in range(6)]
                return await asyncio.gather(*calls, return_exceptions=True)

        no_retry = asyncio.run(burst(0))
        refused = [r for r in no_retry if isinstance(r, RLServeError)]
        assert refused and all(isinstance(r, OverloadedError) for r in refused)
        assert all(r.retry_after == 1.0 for r in refused)
        with_retry = asyncio.run(burst(8))
        assert all(isinstance(r, ActResult) for r in with_retry), with_retry


def test_a_new_session_never_inherits_an_ended_ones_state(url):
    """Slots are recycled; the first step of a new session must start from the initial state."""
    with PolicyClient(url, "cartpole-memory", explore=False) as client:
        fresh = client.act([0.02, 0.05], outputs=["value"]).value
        for i in range(3):
            client.create_session(f"recycled-{i}")
            first = client.act([0.02, 0.05], session_id=f"recycled-{i}", outputs=["value"]).value
            client.act([0.5, -0.1], session_id=f"recycled-{i}")
            client.end_session(f"recycled-{i}")
            assert first == pytest.approx(fresh, rel=1e-6)
