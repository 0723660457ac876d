"""A stream's session outlives its replica: with the Redis store, a stream on a replica that
is SIGKILLed resumes by id on another one, retries the step whose answer was lost, and the
episode goes on exactly as an uninterrupted one (real redis-server, two real servers)."""

from __future__ import annotations

import pytest
from fleet import MODEL, model_repository, replica_processes

from rlserve.client import Stream

pytestmark = pytest.mark.e2e

OBSERVATIONS = [[0.01 * i, -0.02 * i] for i in range(6)]


@pytest.fixture
def replicas(redis_server, tmp_path):
    yield from replica_processes(redis_server.url, model_repository(tmp_path))


def _answer(stream: Stream, i: int) -> tuple[int, float]:
    raw = stream.step(OBSERVATIONS[i], reward=1.0, step=i).raw
    return raw["action"], raw["logp"]


def test_a_stream_resumes_on_another_replica_after_a_sigkill(replicas):
    first, second = replicas(2)
    with Stream(second.url, MODEL, seed=11, explore=True) as whole:
        expected = [_answer(whole, i) for i in range(len(OBSERVATIONS))]
    doomed = Stream(first.url, MODEL, seed=11, explore=True)
    got = [_answer(doomed, i) for i in range(3)]
    session = doomed.session_id
    first.kill()  # no shutdown of any kind; the socket just dies
    with Stream(second.url, MODEL, session_id=session, explore=True) as resumed:
        assert _answer(resumed, 2) == got[2]  # the retried step is answered as it was, not stepped again
        got += [_answer(resumed, i) for i in range(3, len(OBSERVATIONS))]
    assert got == expected


def test_a_policy_set_stream_resumes_its_episode_on_another_replica_after_a_sigkill(replicas, tmp_path):
    """The multi-agent stream's episode (two recurrent agents, seeded sampling) resumed by
    ``episode_id`` on another replica goes on exactly as an uninterrupted one."""
    import json

    from rlserve.client.agents_stream import AgentsStream
    from rlserve.models.export.policy_set_export import policy_set_from_bundles
    from rlserve.models.multiagent.mapping import AgentMapping

    with policy_set_from_bundles({"rnn": tmp_path / "models" / MODEL}, tmp_path / "team", AgentMapping({}, [], "rnn"),
                                 name="team"):
        pass
    steps = [{agent: {"observation": [0.01 * i, -0.02 * i * (1 + k)], **({"reward": 1.0} if i else {})}
              for k, agent in enumerate(("a", "b"))} for i in range(6)]

    def answers(stream: AgentsStream, part: list[dict]) -> list[dict]:
        return [{agent: (one["action"], one["logp"]) for agent, one in stream.step(step).raw["agents"].items()}
                for step in part]

    first, second = replicas(2, RLSERVE_POLICY_SETS=json.dumps([str(tmp_path / "team")]))
    with AgentsStream(second.url, "team", seed=11, explore=True) as whole:
        expected = answers(whole, steps)
    doomed = AgentsStream(first.url, "team", seed=11, explore=True)
    got = answers(doomed, steps[:3])
    episode = doomed.episode_id
    first.kill()  # no shutdown of any kind; the socket just dies
    with AgentsStream(second.url, "team", episode_id=episode, explore=True) as resumed:
        got += answers(resumed, steps[3:])
    assert got == expected
