"""The gRPC status a client's retry loop reads, end to end (`rlserve serve` and Triton's
gRPC client): ABORTED only where a retry may succeed (the sequence changed elsewhere
while the step ran), FAILED_PRECONDITION where the same request would be refused again
(a ``parameters.step`` that is not the sequence's). A wrong step index used to answer
ABORTED, so a client that retries on ABORTED resent the refused step for ever.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton
from grpc_calls import lstm_observations, refused, tensor
from plain_http import HTTP
from server_process import free_port, running_server
from test_kserve_v2_e2e import repo as repo  # noqa: F401 (the module's bundles, a fixture)

pytestmark = pytest.mark.e2e


def test_a_wrong_step_index_is_failed_precondition_and_leaves_the_sequence(repo):  # noqa: F811
    port = free_port()
    observations = lstm_observations(3, seed=5)
    with running_server(["--repository", str(repo), "--grpc-port", str(port)],
                        env={"RLSERVE_MAX_BATCH_DELAY_MS": "1"}) as base:
        client = triton.InferenceServerClient(f"127.0.0.1:{port}")
        for t in range(2):
            client.infer("lstm", [tensor("obs", observations[t][None])], sequence_id="s", sequence_start=t == 0,
                         parameters={"explore": False, "step": t})
        for step in (0, 3, 2 ** 63 - 1):  # behind (not the last, so no kept answer), ahead, far ahead
            error = refused(lambda step=step: client.infer("lstm", [tensor("obs", observations[2][None])],
                                                           sequence_id="s", parameters={"step": step}))
            assert error.status() == "StatusCode.FAILED_PRECONDITION", (step, str(error))
            assert f"parameters.step says it is step {step}" in error.message(), error.message()
        client.close()
        assert HTTP.get(f"{base}/v1/models/lstm/sessions/s").json()["steps"] == 2


def test_a_sequence_changed_elsewhere_is_aborted_and_its_retry_is_answered(repo: Path, redis_server):  # noqa: F811
    """Two replicas share a redis-server and trust their copies (no read before a batch):
    the replica holding a stale copy refuses the step (the store's write fails), drops
    the copy, and the same request sent again is answered."""
    ports = [free_port(), free_port()]
    env = {"RLSERVE_SESSION_STORE": redis_server.url, "RLSERVE_SESSION_CACHE": "trust",
           "RLSERVE_MAX_BATCH_DELAY_MS": "1"}
    observations = lstm_observations(3, seed=9)
    with running_server(["--repository", str(repo), "--grpc-port", str(ports[0])], env=env), \
            running_server(["--repository", str(repo), "--grpc-port", str(ports[1])], env=env):
        a, b = (triton.InferenceServerClient(f"127.0.0.1:{port}") for port in ports)

        def step(client: triton.InferenceServerClient, t: int) -> triton.InferResult:
            return client.infer("lstm", [tensor("obs", observations[t][None])], sequence_id="moved",
                                sequence_start=t == 0, parameters={"explore": False})

        step(a, 0)
        step(b, 1)  # b reads the sequence from the store; a's copy is now stale
        error = refused(lambda: step(a, 2))
        assert error.status() == "StatusCode.ABORTED", str(error)
        assert "changed elsewhere" in error.message() and "retry" in error.message()
        answer = step(a, 2)  # the retry reads the sequence again
        assert np.asarray(answer.as_numpy("action")).shape[0] == 1
        a.close()
        b.close()
