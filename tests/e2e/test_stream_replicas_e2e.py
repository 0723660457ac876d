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
