"""The Open Inference Protocol over gRPC end to end: Triton's own gRPC client against `rlserve serve`.

A real uvicorn process serves the bundles of the REST protocol's test (a stateless MLP, a
Dict observation carrying an action mask, an LSTM reading previous actions and rewards)
and, with ``RLSERVE_GRPC_PORT``, the protocol's gRPC service on the same event loop.
``tritonclient.grpc.InferenceServerClient`` (and, for what it cannot send, the generated
stub it ships) drives it, and every answer is compared with what the JSON API of the same
server answers for the same observations.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from grpc_calls import Stream, lstm_observations, refused, tensor, wanted
from plain_http import HTTP
from server_process import ServerProcess, free_port, rlserve_command, running_server
from test_kserve_v2_e2e import BATCH_OF_FOUR, MASKS, act, f32, shares_one_batch_with_a_json_request
from test_kserve_v2_e2e import repo as repo  # noqa: F401 (the module's bundles, a fixture)
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def servers(repo: Path) -> Iterator[tuple[str, str]]:  # noqa: F811
    """(HTTP base URL, gRPC address) of one server."""
    port = free_port()
    with running_server(["--repository", str(repo), "--grpc-port", str(port)],
                        env={"RLSERVE_MAX_BATCH_DELAY_MS": "1"}) as base:
        yield base, f"127.0.0.1:{port}"


@pytest.fixture
def url(servers) -> str:
    return servers[0]


@pytest.fixture
def client(servers) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(servers[1])
    yield c
    c.close()


@pytest.fixture
def stub(servers) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    """The generated stub tritonclient ships: for requests its client never builds."""
    with grpc.insecure_channel(servers[1]) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


# --------------------------------------------------------------------------- health and metadata

def test_health_server_metadata_and_readiness(client):
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta.name == "rlserve" and {"binary_tensor_data", "sequence"} <= set(meta.extensions)
    assert client.is_model_ready("mlp") and client.is_model_ready("lstm", "1")
    assert not client.is_model_ready("no-such-model") and not client.is_model_ready("mlp", "9")


def test_model_metadata_names_every_tensor_like_the_rest_metadata(client, url):
    for name in ("mlp", "masked", "lstm"):
        meta = client.get_model_metadata(name, as_json=True)
        rest = HTTP.get(f"{url}/v2/models/{name}").json()
        assert meta["name"] == rest["name"] and meta["versions"] == rest["versions"]
        assert meta["platform"] == rest["platform"] == "rlserve_onnx"
        for side in ("inputs", "outputs"):  # protobuf's JSON writes int64 shapes as strings
            assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in meta[side]] == [
                (t["name"], t["datatype"], t["shape"]) for t in rest[side]]
    error = refused(lambda: client.get_model_metadata("no-such-model"))
    assert error.status() == "StatusCode.NOT_FOUND" and "no-such-model" in error.message()


# --------------------------------------------------------------------------- streaming (ModelStreamInfer)

def test_a_streamed_lstm_sequence_steps_like_a_json_session_even_when_steps_are_not_awaited(client, url):
    """Triton's sequence clients stream their steps: every answer equals a JSON session's
    step; steps sent back to back (without waiting for answers) still apply in order."""
    observations = lstm_observations(8, seed=71)
    stream = Stream(client)
    answers = []
    try:
        for t, obs in enumerate(observations):
            client.async_stream_infer("lstm", [tensor("obs", obs[None])], request_id=f"step-{t}",
                                      sequence_id="streamed", sequence_start=t == 0,
                                      sequence_end=t == len(observations) - 1, parameters={"explore": False})
            if t < 4:  # the first half step by step, the second half sent at once
                answers.append(stream.next())
        answers += [stream.next() for _ in range(4)]
    finally:
        stream.close()
    assert [error for _, error in answers] == [None] * len(observations)
    got = {r.get_response().id: r for r, _ in answers}
    assert sorted(got) == [f"step-{t}" for t in range(len(observations))]
    for t, obs in enumerate(observations):
        body: dict = {"observation": obs.tolist(), "session_id": "json-streamed", "explore": False}
        if t == 0:
            body["episode_start"] = True
        expected = act(url, "lstm", body)
        np.testing.assert_array_equal(got[f"step-{t}"].as_numpy("action"), f32([expected["action"]]))
        np.testing.assert_array_equal(got[f"step-{t}"].as_numpy("logp"), f32([expected["logp"]]))
    assert HTTP.get(f"{url}/v1/models/lstm/sessions/streamed").status_code == 410  # sequence_end applied last


def test_a_refused_streamed_request_is_an_error_answer_and_the_stream_goes_on(client, url):
    obs = np.random.default_rng(72).uniform(-1, 1, (16, 4)).astype(np.float32)
    stream = Stream(client)
    try:
        client.async_stream_infer("mlp", [tensor("obs", np.zeros((1, 5), np.float32))], request_id="bad")
        for i in range(16):  # sent at once: answered concurrently, so they may share batches
            client.async_stream_infer("mlp", [tensor("obs", obs[i:i + 1])], request_id=f"row-{i}",
                                      parameters={"explore": False})
        answers = [stream.next() for _ in range(17)]
    finally:
        stream.close()
    errors = [error for result, error in answers if error is not None]
    assert len(errors) == 1 and "'obs'" in errors[0].message() and "[1,5]" in errors[0].message()
    results = {r.get_response().id: r for r, error in answers if error is None}
    expected = act(url, "mlp", {"observations": obs.tolist(), "explore": False})["actions"]
    assert {rid: r.as_numpy("action").tolist() for rid, r in results.items()} == {
        f"row-{i}": [expected[i]] for i in range(16)}


def test_calls_rlserve_does_not_answer_are_unimplemented(client):
    error = refused(lambda: client.get_model_config("mlp"))
    assert error.status() == "StatusCode.UNIMPLEMENTED"


# --------------------------------------------------------------------------- stateless MLP

@pytest.mark.parametrize("rows", [1, 7])
def test_mlp_answers_equal_the_json_api(client, url, rows):
    obs = np.random.default_rng(rows).uniform(-1, 1, (rows, 4)).astype(np.float32)
    result = client.infer("mlp", [tensor("obs", obs)], outputs=wanted("action", "logp", "value"),
                          parameters={"explore": False}, request_id="g-1")
    expected = act(url, "mlp", {"observations": obs.tolist(), "explore": False, "outputs": ["value"]})
    np.testing.assert_array_equal(result.as_numpy("action"), np.asarray(expected["actions"], dtype=np.int64))
    np.testing.assert_array_equal(result.as_numpy("logp"), f32(expected["logp"]))
    np.testing.assert_array_equal(result.as_numpy("value"), f32(expected["value"]))
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == ("mlp", "1", "g-1")
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("action", "INT64", [rows]), ("logp", "FP32", [rows]), ("value", "FP32", [rows])]


def test_outputs_default_to_action_and_logp(client, url):
    obs = np.random.default_rng(3).uniform(-1, 1, (4, 4)).astype(np.float32)
    everything = client.infer("mlp", [tensor("obs", obs)], parameters={"explore": False})
    assert [o.name for o in everything.get_response().outputs] == ["action", "logp"]
    only = client.infer("mlp", [tensor("obs", obs)], outputs=wanted("entropy", "dist_inputs"),
                        parameters={"explore": False})
    assert [o.name for o in only.get_response().outputs] == ["entropy", "dist_inputs"]
    expected = act(url, "mlp", {"observations": obs.tolist(), "explore": False, "outputs": ["entropy", "dist_inputs"]})
    np.testing.assert_array_equal(only.as_numpy("entropy"), f32(expected["entropy"]))
    np.testing.assert_array_equal(only.as_numpy("dist_inputs"), f32(expected["dist_inputs"]))


def test_typed_contents_are_read_like_raw_inputs(client, stub):
    """``InferTensorContents`` (the protocol's typed values; tritonclient always sends raw
    bytes) give the same answer, and a value in the wrong contents field is refused."""
    obs = np.random.default_rng(4).uniform(-1, 1, (3, 4)).astype(np.float32)
    request, typed = _typed_request("FP32", obs, "fp32_contents")
    _answers_as_raw(client, stub, request, obs)
    typed.ClearField("contents")
    typed.contents.fp64_contents.extend(obs.ravel().tolist())
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'obs'" in info.value.details() and "fp32_contents" in info.value.details()


def test_uint64_contents_past_int64_are_read_like_their_raw_bytes(client, stub):
    # uint64_contents with 2**64-1 was refused ("the nested lists' lengths differ"): numpy
    # read the Python ints as float64. Raw bytes of the same values were always taken.
    obs = np.array([[2 ** 64 - 1, 0, 0, 0], [2 ** 63 + 1, 1, 0, 0]], np.uint64)
    request, _ = _typed_request("UINT64", obs, "uint64_contents")
    _answers_as_raw(client, stub, request, obs)


def _typed_request(datatype: str, obs: np.ndarray, field: str):
    """(a ModelInferRequest of ``mlp`` carrying ``obs`` in ``contents.<field>``, its input)."""
    request = service_pb2.ModelInferRequest(model_name="mlp")
    request.parameters["explore"].bool_param = False
    typed = request.inputs.add(name="obs", datatype=datatype, shape=list(obs.shape))
    getattr(typed.contents, field).extend(obs.ravel().tolist())
    request.outputs.add(name="action")
    request.outputs.add(name="logp")
    return request, typed


def _answers_as_raw(client, stub, request, obs: np.ndarray) -> None:
    """``request`` answers what tritonclient's raw bytes of ``obs`` answer."""
    raw = client.infer("mlp", [tensor("obs", obs)], outputs=wanted("action", "logp"), parameters={"explore": False})
    response = stub.ModelInfer(request)
    assert [o.name for o in response.outputs] == ["action", "logp"]
    assert np.frombuffer(response.raw_output_contents[0], "<i8").tolist() == raw.as_numpy("action").tolist()
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[1], "<f4"), raw.as_numpy("logp"))


# --------------------------------------------------------------------------- Dict observation, masks

def test_dict_observation_with_its_action_mask_equals_the_json_api(client, url):
    features = np.random.default_rng(11).uniform(-1, 1, (4, 3)).astype(np.float32)
    inputs = [tensor("obs.action_mask", MASKS), tensor("obs.observations", features)]
    result = client.infer("masked", inputs, outputs=wanted("action", "logp", "value"), parameters={"explore": False})
    rows = [{"action_mask": m.tolist(), "observations": f.tolist()} for m, f in zip(MASKS, features, strict=True)]
    expected = act(url, "masked", {"observations": rows, "explore": False, "outputs": ["value"]})
    np.testing.assert_array_equal(result.as_numpy("action"), np.asarray(expected["actions"], dtype=np.int64))
    np.testing.assert_array_equal(result.as_numpy("logp"), f32(expected["logp"]))
    np.testing.assert_array_equal(result.as_numpy("value"), f32(expected["value"]))
    override = client.infer("masked", [*inputs[:1], inputs[1], tensor("action_mask", MASKS.astype(bool))],
                            parameters={"explore": True})
    for mask, action in zip(MASKS, override.as_numpy("action"), strict=True):  # MultiDiscrete([2, 3])
        assert mask[action[0]] == 1 and mask[2 + action[1]] == 1


# --------------------------------------------------------------------------- sequences (LSTM)

def test_an_lstm_sequence_steps_like_a_json_session(client, url):
    """sequence_start creates the session, each step feeds the stored state and the
    reward, sequence_end ends it: step for step what a JSON session does."""
    observations = lstm_observations(6, seed=41)
    for t, obs in enumerate(observations):
        inputs = [tensor("obs", obs[None])]
        body: dict = {"observation": obs.tolist(), "session_id": "grpc-json-lstm", "explore": False,
                      "outputs": ["value"]}
        if t == 0:
            body["episode_start"] = True
        else:
            reward = np.array([0.5 * t], dtype=np.float32)
            inputs.append(tensor("reward", reward))
            body["reward"] = float(reward[0])
        result = client.infer("lstm", inputs, outputs=wanted("action", "logp", "value"), sequence_id=4_001,
                              sequence_start=t == 0, sequence_end=t == len(observations) - 1,
                              parameters={"explore": False})
        expected = act(url, "lstm", body)
        np.testing.assert_array_equal(result.as_numpy("action"), f32([expected["action"]]))
        np.testing.assert_array_equal(result.as_numpy("logp"), f32([expected["logp"]]))
        np.testing.assert_array_equal(result.as_numpy("value"), f32([expected["value"]]))
    # sequence_end ended the session: stepping it again is refused until a new start.
    error = refused(lambda: client.infer("lstm", [tensor("obs", observations[:1])], sequence_id=4_001))
    assert error.status() == "StatusCode.FAILED_PRECONDITION" and "sequence_start" in error.message()
    assert HTTP.get(f"{url}/v1/models/lstm/sessions/4001").status_code == 410


def test_a_seeded_string_sequence_samples_like_a_seeded_json_session_and_a_retried_step_is_not_applied_twice(
        client, url):
    observations = lstm_observations(5, seed=42)
    drawn: dict[str, list] = {"grpc": [], "json": []}
    for t, obs in enumerate(observations):
        result = client.infer("lstm", [tensor("obs", obs[None])], sequence_id="grpc-seeded", sequence_start=t == 0,
                              parameters={"explore": True, "step": t, **({"seed": 7} if t == 0 else {})})
        drawn["grpc"].append((result.as_numpy("action")[0].tolist(), float(result.as_numpy("logp")[0])))
        body = {"observation": obs.tolist(), "session_id": "json-seeded", "explore": True}
        if t == 0:
            body.update(episode_start=True, seed=7)
        answer = act(url, "lstm", body)
        drawn["json"].append((f32(answer["action"]).tolist(), float(f32(answer["logp"]))))
    assert drawn["grpc"] == drawn["json"]
    assert len({tuple(a) for a, _ in drawn["grpc"]}) > 1  # really sampled, not one mode
    # The last step sent again (its answer was lost): answered from the kept answer.
    again = client.infer("lstm", [tensor("obs", observations[-1][None])], sequence_id="grpc-seeded",
                         parameters={"explore": True, "step": len(observations) - 1})
    assert (again.as_numpy("action")[0].tolist(), float(again.as_numpy("logp")[0])) == drawn["grpc"][-1]
    assert HTTP.get(f"{url}/v1/models/lstm/sessions/grpc-seeded").json()["steps"] == len(observations)


# --------------------------------------------------------------------------- errors

def test_refusals_are_status_codes_whose_message_names_the_tensor(client, stub):
    error = refused(lambda: client.infer("mlp", [tensor("obs", np.zeros((2, 5), np.float32))]))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "'obs'" in error.message() and "[-1,4]" in error.message() and "[2,5]" in error.message()
    error = refused(lambda: client.infer("mlp", [tensor("obs", np.array([[0.1, np.nan, 0.0, 0.0]], np.float32))]))
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and "finite" in error.message()
    error = refused(lambda: client.infer("no-such-model", [tensor("obs", np.zeros((1, 4), np.float32))]))
    assert error.status() == "StatusCode.NOT_FOUND"
    error = refused(lambda: client.infer("mlp", [tensor("obs", np.zeros((1, 4), np.float32))],
                                         parameters={"shuffle": True}))
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and "['shuffle']" in error.message()
    request = service_pb2.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="obs", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.extend([np.zeros(4, np.float32).tobytes(), b"extra"])
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "raw_input_contents" in info.value.details()
    request.raw_input_contents.pop()
    request.inputs[0].shape[:] = [1, -4]
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "shape" in info.value.details()
    del request.raw_input_contents[:]  # no data at all: named in gRPC's terms, not REST's 'data'
    request.inputs[0].shape[:] = [1, 4]
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "raw_input_contents or contents.fp32_contents" in info.value.details()
    assert "'data'" not in info.value.details()


def test_a_refused_sequence_step_leaves_the_session_as_it_was(client, url):
    obs = lstm_observations(2, seed=44)
    client.infer("lstm", [tensor("obs", obs[:1])], sequence_id=4_077, sequence_start=True)
    steps = HTTP.get(f"{url}/v1/models/lstm/sessions/4077").json()["steps"]
    refused(lambda: client.infer("lstm", [tensor("obs", obs[1:]), tensor("reward", np.array([np.inf], np.float32))],
                                 sequence_id=4_077))
    assert HTTP.get(f"{url}/v1/models/lstm/sessions/4077").json()["steps"] == steps


# --------------------------------------------------------------------------- one batch, processes

def test_a_grpc_request_and_a_json_request_share_one_batch(repo):  # noqa: F811
    port = free_port()
    with running_server(["--repository", str(repo), "--grpc-port", str(port)], env=BATCH_OF_FOUR) as base:
        c = triton.InferenceServerClient(f"127.0.0.1:{port}")
        obs = np.random.default_rng(51).uniform(-1, 1, (3, 4)).astype(np.float32)
        shares_one_batch_with_a_json_request(base, lambda: c.infer("mlp", [tensor("obs", obs)]))
        c.close()


def test_workers_share_the_grpc_port(repo):  # noqa: F811
    port = free_port()
    with running_server(["--repository", str(repo), "--grpc-port", str(port), "--workers", "2"]) as base:
        obs = np.random.default_rng(52).uniform(-1, 1, (2, 4)).astype(np.float32)
        expected = act(base, "mlp", {"observations": obs.tolist(), "explore": False})["actions"]
        for _ in range(6):  # new connections: the kernel spreads them over both workers
            c = triton.InferenceServerClient(f"127.0.0.1:{port}")
            assert c.infer("mlp", [tensor("obs", obs)], parameters={"explore": False}).as_numpy(
                "action").tolist() == expected
            c.close()


def test_sigterm_answers_a_grpc_call_in_flight_before_it_exits(repo):  # noqa: F811
    """A call waiting in a batching window when SIGTERM arrives is answered; then the
    server exits and the port is closed."""
    port = free_port()
    server = ServerProcess({"RLSERVE_REPOSITORY": str(repo), "RLSERVE_MAX_BATCH_DELAY_MS": "1500"},
                           args=["--grpc-port", str(port)]).start()
    try:
        c = triton.InferenceServerClient(f"127.0.0.1:{port}")
        assert c.is_server_ready()
        results: list = []
        obs = np.random.default_rng(53).uniform(-1, 1, (2, 4)).astype(np.float32)
        thread = threading.Thread(target=lambda: results.append(c.infer("mlp", [tensor("obs", obs)])))
        thread.start()
        time.sleep(0.5)  # the call is in the batcher's 1.5 s window now
        # uvicorn re-raises SIGTERM once it shut down gracefully: the exit is the signal's.
        assert server.terminate() in (0, -signal.SIGTERM), server.output()
        thread.join(30)
        assert len(results) == 1 and results[0].as_numpy("action").shape == (2,)
        with pytest.raises(InferenceServerException):
            c.is_server_live(client_timeout=2)
        c.close()
    finally:
        server.stop()


def test_a_grpc_port_it_cannot_use_is_refused_at_start(repo):  # noqa: F811
    done = subprocess.run([*rlserve_command(), "serve", "--repository", str(repo), "--workers", "2",
                           "--grpc-port", "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--grpc-port 0" in done.stderr
    port = str(free_port())
    done = subprocess.run([*rlserve_command(), "serve", "--repository", str(repo), "--port", port,
                           "--grpc-port", port], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"--grpc-port {port} is the HTTP port" in done.stderr


def test_a_sequence_alternating_between_two_replicas_over_grpc_steps_like_one_json_session(repo, redis_server):  # noqa: F811
    """Two servers share a redis-server: a sequence's steps alternate between them over
    gRPC (each first visit reads the session from the store, later ones find their copy
    stale and refresh it) and still equal a JSON session stepped on one server."""
    ports = [free_port(), free_port()]
    env = {"RLSERVE_SESSION_STORE": redis_server.url, "RLSERVE_MAX_BATCH_DELAY_MS": "1"}
    with running_server(["--repository", str(repo), "--grpc-port", str(ports[0])], env=env) as base, \
            running_server(["--repository", str(repo), "--grpc-port", str(ports[1])], env=env):
        clients = [triton.InferenceServerClient(f"127.0.0.1:{port}") for port in ports]
        observations = lstm_observations(6, seed=61)
        for t, obs in enumerate(observations):
            body: dict = {"observation": obs.tolist(), "session_id": "json-replicas", "explore": False}
            inputs = [tensor("obs", obs[None])]
            if t == 0:
                body["episode_start"] = True
            else:
                inputs.append(tensor("reward", np.array([0.25 * t], np.float32)))
                body["reward"] = 0.25 * t
            result = clients[t % 2].infer("lstm", inputs, sequence_id="grpc-replicas", sequence_start=t == 0,
                                          parameters={"explore": False, "step": t})
            expected = act(base, "lstm", body)
            np.testing.assert_array_equal(result.as_numpy("action"), f32([expected["action"]]))
            np.testing.assert_array_equal(result.as_numpy("logp"), f32([expected["logp"]]))
        for c in clients:
            c.close()
        assert HTTP.get(f"{base}/v1/models/lstm/sessions/grpc-replicas").json()["steps"] == len(observations)


def test_streamed_steps_sent_back_to_back_to_a_replica_that_must_read_the_sequence_apply_in_order(
        repo, redis_server):  # noqa: F811
    """The sequence started on one server; another one gets its next steps on a stream, all
    sent at once with their step indexes, and must read the session from the store first.
    Its batching window (200 ms) holds each step long enough for the later ones to
    arrive: they wait for the step before them (a step index counts answered steps), apply
    in order and equal a JSON session's."""
    ports = [free_port(), free_port()]
    env = {"RLSERVE_SESSION_STORE": redis_server.url, "RLSERVE_MAX_BATCH_DELAY_MS": "1"}
    observations = lstm_observations(6, seed=81)
    with running_server(["--repository", str(repo), "--grpc-port", str(ports[0])], env=env) as base, \
            running_server(["--repository", str(repo), "--grpc-port", str(ports[1])],
                           env={**env, "RLSERVE_MAX_BATCH_DELAY_MS": "200"}):
        first, second = (triton.InferenceServerClient(f"127.0.0.1:{port}") for port in ports)
        started = first.infer("lstm", [tensor("obs", observations[0][None])], sequence_id="moved",
                              sequence_start=True, parameters={"explore": False})
        stream = Stream(second)
        try:
            for t in range(1, len(observations)):
                second.async_stream_infer("lstm", [tensor("obs", observations[t][None])], request_id=str(t),
                                          sequence_id="moved", parameters={"explore": False, "step": t})
            answers = [stream.next() for _ in range(1, len(observations))]
        finally:
            stream.close()
        first.close()
        second.close()
        assert [str(error) for _, error in answers if error is not None] == []
        got = {int(r.get_response().id): r for r, _ in answers}
        got[0] = started
        for t, obs in enumerate(observations):
            body: dict = {"observation": obs.tolist(), "session_id": "json-moved", "explore": False}
            if t == 0:
                body["episode_start"] = True
            expected = act(base, "lstm", body)
            np.testing.assert_array_equal(got[t].as_numpy("action"), f32([expected["action"]]))
            np.testing.assert_array_equal(got[t].as_numpy("logp"), f32([expected["logp"]]))
