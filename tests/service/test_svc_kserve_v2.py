"""The Open Inference Protocol in process (httpx over ASGI): framing, refusals, routes.

The raw ASGI handler serves ``.../infer`` (the default fast path) and the FastAPI route
serves it with the fast path off; both must answer alike. Every refusal is
``{"error": "<message>"}`` with the protocol's status and a message naming the tensor or
parameter, what was expected and what was received. Real bundles, real ONNX Runtime.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.asyncio

OBS = np.array([[0.1, -0.2, 0.3, 0.05], [0.0, 0.5, -0.5, 0.25]], dtype=np.float32)


def infer_body(inputs: list[dict[str, Any]], binary: bytes = b"", **extra: Any) -> tuple[bytes, dict[str, str]]:
    header = json.dumps({"inputs": inputs, **extra}).encode()
    if not binary:
        return header, {"content-type": "application/json"}
    return header + binary, {"inference-header-content-length": str(len(header)),
                             "content-type": "application/octet-stream"}


def binary_obs(arr: np.ndarray, name: str = "obs", datatype: str = "FP32") -> dict[str, Any]:
    return {"name": name, "shape": list(arr.shape), "datatype": datatype,
            "parameters": {"binary_data_size": arr.nbytes}}


def json_obs(arr: np.ndarray, name: str = "obs", datatype: str = "FP32") -> dict[str, Any]:
    return {"name": name, "shape": list(arr.shape), "datatype": datatype, "data": arr.tolist()}


async def post(client, body: bytes, headers: dict[str, str], model: str = "mlp"):
    return await client.post(f"/v2/models/{model}/infer", content=body, headers=headers)


def refusal(response, status: int = 400) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and isinstance(body["error"], str), body
    return body["error"]


def split(response) -> tuple[dict[str, Any], bytes]:
    length = response.headers.get("inference-header-content-length")
    if length is None:
        return response.json(), b""
    return json.loads(response.content[:int(length)]), response.content[int(length):]


# --------------------------------------------------------------------------- answers

async def test_binary_and_inline_inputs_and_outputs_carry_the_same_values(make_client):
    _, client = make_client(("mlp",))
    params = {"explore": False}
    outputs = [{"name": "action", "parameters": {"binary_data": True}}, {"name": "logp"}]
    body, headers = infer_body([binary_obs(OBS)], OBS.tobytes(), parameters=params, outputs=outputs)
    binary = await post(client, body, headers)
    assert binary.status_code == 200 and binary.headers["content-type"] == "application/octet-stream"
    header, raw = split(binary)
    action, logp = header["outputs"]
    assert action["parameters"] == {"binary_data_size": 16} and action["shape"] == [2] and action["datatype"] == "INT64"
    assert "data" in logp and "parameters" not in logp
    nested = await post(client, *infer_body([json_obs(OBS)], parameters=params, outputs=[{"name": "action"},
                                                                                          {"name": "logp"}]))
    flat_input = {**json_obs(OBS), "data": OBS.ravel().tolist()}
    flat = await post(client, *infer_body([flat_input], parameters=params, outputs=[{"name": "action"},
                                                                                     {"name": "logp"}]))
    assert nested.headers["content-type"] == "application/json"
    assert nested.json() == flat.json()
    assert np.frombuffer(raw, "<i8").tolist() == nested.json()["outputs"][0]["data"]
    assert logp["data"] == nested.json()["outputs"][1]["data"]


async def test_binary_data_output_sends_every_default_output_as_binary(make_client):
    _, client = make_client(("mlp",))
    body, headers = infer_body([binary_obs(OBS)], OBS.tobytes(), parameters={"binary_data_output": True})
    header, raw = split(await post(client, body, headers))
    sizes = [o["parameters"]["binary_data_size"] for o in header["outputs"]]
    assert [o["name"] for o in header["outputs"]] == ["action", "logp"] and sizes == [16, 8]
    assert len(raw) == sum(sizes)


async def test_the_fastapi_route_answers_as_the_fast_path(make_client):
    _, fast = make_client(("mlp", "masked"))
    _, routed = make_client(("mlp", "masked"), fast_act_path=False)
    requests = [
        infer_body([binary_obs(OBS)], OBS.tobytes(), parameters={"explore": False, "binary_data_output": True}),
        infer_body([json_obs(OBS)], parameters={"explore": False}, outputs=[{"name": "value"}], id="x"),
        infer_body([json_obs(OBS[:, :3])]),  # refused: shape
    ]
    for body, headers in requests:
        a, b = await post(fast, body, headers), await post(routed, body, headers)
        assert (a.status_code, a.content) == (b.status_code, b.content)
        assert a.headers.get("inference-header-content-length") == b.headers.get("inference-header-content-length")


async def test_an_image_as_uint8_bytes_equals_the_json_apis_base64(make_client):
    _, client = make_client(("image",))
    image = np.random.default_rng(0).integers(0, 256, (2, 10, 10, 3), dtype=np.uint8)
    params = {"explore": False, "binary_data_output": True}
    body, headers = infer_body([binary_obs(image, datatype="UINT8")], image.tobytes(), parameters=params)
    header, raw = split(await post(client, body, headers, model="image"))
    b64 = [{"b64": base64.b64encode(row.tobytes()).decode(), "dtype": "uint8", "shape": [10, 10, 3]} for row in image]
    expected = (await client.post("/v1/models/image/act", json={"observations": b64, "explore": False})).json()
    action = np.frombuffer(raw[:header["outputs"][0]["parameters"]["binary_data_size"]], "<f4").reshape(2, 2)
    np.testing.assert_array_equal(action, np.asarray(expected["actions"], np.float32))
    # A float tensor for a uint8 image is taken when it holds whole numbers in range.
    as_float = image.astype(np.float32)
    body, headers = infer_body([binary_obs(as_float)], as_float.tobytes(), parameters=params)
    assert split(await post(client, body, headers, model="image"))[1] == raw
    as_float[1, 2, 3, 0] = 300.0
    body, headers = infer_body([binary_obs(as_float)], as_float.tobytes())
    message = refusal(await post(client, body, headers, model="image"))
    assert "'obs'" in message and "row 1 index [2, 3, 0]" in message and "uint8" in message


# --------------------------------------------------------------------------- binary framing

async def test_binary_framing_errors_say_what_the_bytes_should_be(make_client):
    _, client = make_client(("mlp",))
    raw = OBS.tobytes()
    header = json.dumps({"inputs": [binary_obs(OBS)]}).encode()
    too_long = await post(client, header + raw, {"inference-header-content-length": str(len(header) + len(raw) + 1)})
    assert "Inference-Header-Content-Length" in refusal(too_long)
    missing = await post(client, header + raw, {})  # binary data without the header
    assert "not valid JSON" in refusal(missing)
    no_header_json = await post(client, header, {})
    assert "only 0 bytes follow" in refusal(no_header_json)
    wrong_size = dict(binary_obs(OBS), parameters={"binary_data_size": 31})
    body, headers = infer_body([wrong_size], raw[:31])
    message = refusal(await post(client, body, headers))
    assert "'obs'" in message and "32" in message and "31" in message
    body, headers = infer_body([binary_obs(OBS)], raw + b"\0\0\0\0")
    assert "4 bytes of binary data follow" in refusal(await post(client, body, headers))
    both = dict(json_obs(OBS), parameters={"binary_data_size": 32})
    body, headers = infer_body([both], raw)
    assert "both 'data' and binary_data_size" in refusal(await post(client, body, headers))


@pytest.mark.parametrize("length", ["\xb2", "1\xb9", "\xb3\xb3", "\u0662", "\uff11"])
async def test_a_header_length_of_non_ascii_digits_is_a_400_on_both_paths(make_client, length):
    # str.isdigit() takes superscripts, Arabic-Indic and full-width digits; int() refuses
    # the first and would take the others: only ASCII digits are a length.
    body = json.dumps({"inputs": [json_obs(OBS)]}).encode()
    for fast in (True, False):
        _, client = make_client(("mlp",), fast_act_path=fast)
        headers = {"content-type": "application/json",
                   "inference-header-content-length": length.encode("utf-8")}
        message = refusal(await post(client, body, headers))
        assert "Inference-Header-Content-Length" in message and f"[1, {len(body)}]" in message


# --------------------------------------------------------------------------- refusals

@pytest.mark.parametrize(("inputs", "extra", "words"), [
    ([json_obs(OBS), json_obs(OBS)], {}, ["'obs' is given twice"]),
    ([json_obs(OBS, name="observation")], {}, ["unknown input 'observation'", "obs"]),
    ([json_obs(np.zeros((2, 3), np.float32), name="action_mask", datatype="FP32")], {}, ["missing input(s) ['obs']"]),
    ([json_obs(OBS), {"name": "action_mask", "shape": [3, 3], "datatype": "BOOL", "data": [True] * 9}], {},
     ["'action_mask' has 3 rows", "2"]),
    ([json_obs(np.zeros((0, 4), np.float32))], {}, ["no rows"]),
    ([{"name": "obs", "shape": [2, 4], "datatype": "FP32", "data": [1.0] * 7}], {}, ["7 elements", "needs 8"]),
    ([{"name": "obs", "shape": [1, 4], "datatype": "INT8", "data": [1, 2, 3, 400]}], {}, ["400", "INT8"]),
    ([{"name": "obs", "shape": [1, 4], "datatype": "FP32", "data": ["a", "b", "c", "d"]}], {}, ["FP32", "numbers"]),
    # Each used to say "the nested lists' lengths differ": numpy made them float64 or objects.
    ([{"name": "obs", "shape": [1, 4], "datatype": "UINT64", "data": [2 ** 64, 0, 0, 0]}], {},
     ["element 0 is 18446744073709551616, outside UINT64", "[0, 18446744073709551615]"]),
    ([{"name": "obs", "shape": [1, 4], "datatype": "INT64", "data": [[0, 2 ** 63, -1, 0]]}], {},
     ["element [0, 1] is 9223372036854775808, outside INT64", "[-9223372036854775808, 9223372036854775807]"]),
    ([{"name": "obs", "shape": [1, 4], "datatype": "UINT64", "data": [2 ** 64 - 1, 0.5, 0, 0]}], {},
     ["'data' of UINT64 must hold integers; element 1 is 0.5"]),
    ([{"name": "obs", "shape": [1, 4], "datatype": "FP32", "data": [True, False, True, False]}], {},
     ["'data' of FP32 must hold finite numbers; element 0 is true"]),
    ([{"name": "obs", "shape": [1, 4], "datatype": "INT32", "data": [False] * 4}], {},
     ["'data' of INT32 must hold integers; element 0 is false"]),
    ([{"name": "obs", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 10 ** 400]}], {},
     ["element 3 is", "outside FP32", "1.79769e+308"]),
    ([{"name": "obs", "shape": [2, 4], "datatype": "UINT64", "data": [[2 ** 64 - 1, 0, 0, 0], [0, 0, 0]]}], {},
     ["UINT64", "the nested lists' lengths differ"]),
    ([{"name": "obs", "shape": [1, 4], "datatype": "BYTES", "data": ["a", "b", "c", "d"]}], {}, ["BYTES"]),
    ([{"name": "obs", "shape": [1, 4], "datatype": "FP8", "data": [0, 0, 0, 0]}], {}, ["unknown datatype 'FP8'"]),
    ([json_obs(OBS)], {"parameters": {"temperature": 2}}, ["unknown request parameter", "temperature", "explore"]),
    ([json_obs(OBS)], {"parameters": {"explore": "yes"}}, ["parameters.explore", "boolean"]),
    ([json_obs(OBS)], {"parameters": {"seed": 3}}, ["parameters.seed", "sequence_start"]),
    ([json_obs(OBS)], {"parameters": {"epsilon": 2}}, ["parameters.epsilon", "[0, 1]", "received 2"]),
    ([json_obs(OBS)], {"parameters": {"epsilon": 0.5}}, ["'parameters.epsilon'", "Q-policies", "received"]),
    ([json_obs(OBS)], {"parameters": {"sequence_start": True}}, ["sequence_id"]),
    ([json_obs(OBS)], {"parameters": {"sequence_id": -4}}, ["sequence_id", "unsigned 64-bit"]),
    ([json_obs(OBS)], {"parameters": {"step": 2}}, ["parameters.step", "sequence_id"]),
    ([json_obs(OBS)], {"parameters": {"sequence_id": 3, "step": -1}}, ["parameters.step", "integer >= 0", "-1"]),
    ([json_obs(OBS)], {"parameters": {"sequence_id": 3, "step": True}}, ["parameters.step", "integer >= 0"]),
    ([json_obs(OBS)], {"parameters": {"sequence_id": 3, "sequence_start": True, "step": 4}},
     ["parameters.step", "step 0", "received 4"]),
    ([json_obs(OBS)], {"outputs": [{"name": "q_values"}]}, ["unknown output 'q_values'", "dist_inputs"]),
    ([json_obs(OBS)], {"outputs": [{"name": "action", "parameters": {"classification": 2}}]}, ["classification"]),
    ([json_obs(OBS)], {"outputs": [{"name": "logp"}, {"name": "logp"}]}, ["requested twice"]),
    ([json_obs(OBS)], {"model_name": "other"}, ["model_name 'other'", "mlp"]),
    ([json_obs(OBS), {"name": "action_mask", "shape": [2, 3], "datatype": "BOOL", "data": [False] * 6}], {},
     ["'action_mask' row 0", "excludes every action"]),
])
async def test_refusals_name_what_was_expected_and_received(make_client, inputs, extra, words):
    _, client = make_client(("mlp",))
    message = refusal(await post(client, *infer_body(inputs, **extra)))
    for word in words:
        assert word in message, message


async def test_inline_integers_past_int64_answer_as_their_binary_form(make_client):
    # UINT64 2**64-1 inline was refused ("the nested lists' lengths differ") while its
    # binary form was read; an FP32 10**30 written as an integer answers as 1e30 does.
    _, client = make_client(("mlp",))
    params = {"explore": False}
    for rows in ([[2 ** 64 - 1, 0, 0, 0], [2 ** 63 + 1, 1, 0, 0]], [[1, 0, 0, 0]]):
        arr = np.array(rows, np.uint64)
        inline = await post(client, *infer_body([json_obs(arr, datatype="UINT64")], parameters=params))
        binary = await post(client, *infer_body([binary_obs(arr, datatype="UINT64")], arr.tobytes(),
                                                parameters=params))
        assert inline.status_code == 200, inline.text
        assert inline.content == binary.content
    fp32 = {"name": "obs", "shape": [1, 4], "datatype": "FP32"}
    as_int = await post(client, *infer_body([{**fp32, "data": [0, 0, 0, 10 ** 30]}], parameters=params))
    as_float = await post(client, *infer_body([{**fp32, "data": [0.0, 0.0, 0.0, 1e30]}], parameters=params))
    assert as_int.status_code == 200, as_int.text
    assert as_int.content == as_float.content


async def test_uint64_inline_values_are_read_exactly():
    from rlserve.service.protocols.kserve_v2.tensors import read_input
    from rlserve.service.protocols.kserve_v2.wire import InferRequestInput
    from rlserve.service.step.sizes import Expect

    values = [[2 ** 64 - 1, 2 ** 63 + 1, 2 ** 64 - 2, 0]]  # float64 would round all three to 2**64 or 2**63
    inp = InferRequestInput(name="obs", shape=[1, 4], datatype="UINT64", data=values)
    arr, _ = read_input(inp, memoryview(b""), 0, Expect(8, ((4,),), -1))
    assert arr.dtype == np.uint64 and arr.tolist() == values
    binary = np.array(values, np.uint64)
    raw, _ = read_input(InferRequestInput(name="obs", shape=[1, 4], datatype="UINT64",
                                          parameters={"binary_data_size": 32}), memoryview(binary.tobytes()), 0,
                        Expect(8, ((4,),), -1))
    np.testing.assert_array_equal(arr, raw)


async def test_a_sequence_steps_one_row(make_client):
    _, client = make_client(("lstm",))
    message = refusal(await post(client, *infer_body([json_obs(OBS)], parameters={
        "sequence_id": 5, "sequence_start": True}), model="lstm"))
    assert "one row at a time" in message and "2 rows" in message


def _sequence_step(t: int, obs: np.ndarray, **parameters: Any) -> tuple[bytes, dict[str, str]]:
    """Step t of sequence "r" with its step index; the outputs a retry must repeat."""
    parameters = {"sequence_id": "r", "step": t, "explore": True, **parameters}
    if t == 0:
        parameters.update(sequence_start=True, seed=11)
    outputs = [{"name": n} for n in ("action", "logp", "value", "dist_inputs")]
    return infer_body([json_obs(obs[t:t + 1])], outputs=outputs, parameters=parameters)


@pytest.mark.parametrize("external", [False, True], ids=["in-process", "redis"])
async def test_a_retried_sequence_step_is_answered_again_not_applied_twice(make_client, redis_server, external):
    """``parameters.step``: a step sent again (its answer was lost) gets the same outputs,
    inline or binary, and the sequence does not move; a step that does not fit is refused
    in the protocol's shape with both counts."""
    settings = {"session_store": redis_server.url} if external else {}
    _, client = make_client(("lstm",), **settings)
    _, reference = make_client(("lstm",))
    obs = np.random.default_rng(4).uniform(-1, 1, (4, 4)).astype(np.float32)
    expected = [split(await post(reference, *_sequence_step(t, obs), model="lstm"))[0]["outputs"] for t in range(4)]
    for t in range(2):
        first = await post(client, *_sequence_step(t, obs), model="lstm")
        again = await post(client, *_sequence_step(t, obs), model="lstm")
        assert split(first)[0]["outputs"] == split(again)[0]["outputs"] == expected[t], t
    binary = await post(client, *_sequence_step(1, obs, binary_data_output=True), model="lstm")
    header, blobs = split(binary)
    sizes = [o["parameters"]["binary_data_size"] for o in header["outputs"]]
    assert sum(sizes) == len(blobs) and [o["name"] for o in header["outputs"]] == ["action", "logp", "value",
                                                                                  "dist_inputs"]
    logp_at = sizes[0]
    assert np.frombuffer(blobs[logp_at:logp_at + sizes[1]], np.float32)[0] == pytest.approx(expected[1][1]["data"][0])
    ahead = refusal(await post(client, *_sequence_step(3, obs), model="lstm"))
    assert "sequence 'r' has answered 2 steps of this sequence" in ahead, ahead
    assert "parameters.step says it is step 3" in ahead and "episode" not in ahead, ahead
    # The retries did not move it: steps 2 and 3 are those of the uninterrupted run.
    for t in (2, 3):
        assert split(await post(client, *_sequence_step(t, obs), model="lstm"))[0]["outputs"] == expected[t]


async def test_unknown_models_versions_and_sequences_are_404(make_client):
    _, client = make_client(("lstm",))
    body, headers = infer_body([json_obs(OBS[:1])])
    assert "no model named 'nope'" in refusal(await post(client, body, headers, model="nope"), 404)
    pinned = await client.post("/v2/models/lstm/versions/9/infer", content=body, headers=headers)
    assert "no version '9'" in refusal(pinned, 404)
    stepped = await post(client, *infer_body([json_obs(OBS[:1])], parameters={"sequence_id": "never-started"}),
                         model="lstm")
    message = refusal(stepped, 404)
    assert "unknown sequence 'never-started'" in message and "sequence_start=true" in message
    assert "episode_start" not in message and "session" not in message.split("(")[0]


async def test_a_full_queue_is_503_with_retry_after(make_client):
    app, client = make_client(("mlp",), queue_limit=1)
    batcher = app.state.registry.entry("mlp").policy().batcher
    batcher._rows_queued = 1  # another request's rows are queued
    response = await post(client, *infer_body([json_obs(OBS)]))
    assert "retry later" in refusal(response, 503) and response.headers["retry-after"] == "1"


# --------------------------------------------------------------------------- health, metadata, openapi

async def test_health_and_metadata_routes(make_client):
    app, client = make_client(("mlp", "lstm"))
    assert (await client.get("/v2/health/live")).json() == {"live": True}
    assert (await client.get("/v2/health/ready")).json() == {"ready": True}
    server = (await client.get("/v2")).json()
    assert server["name"] == "rlserve" and "binary_tensor_data" in server["extensions"]
    assert (await client.get("/v2/models/lstm/ready")).json() == {"name": "lstm", "ready": True}
    assert (await client.get("/v2/models/lstm/versions/1/ready")).status_code == 200
    assert "no version '2'" in refusal(await client.get("/v2/models/lstm/versions/2/ready"), 404)
    assert "no model named 'x'" in refusal(await client.get("/v2/models/x"), 404)
    meta = (await client.get("/v2/models/lstm/versions/1")).json()
    assert meta["platform"] == "rlserve_onnx" and meta["parameters"]["default_outputs"] == ["action", "logp"]
    # SIGTERM: load balancers probing the protocol's readiness stop sending too. The protocol's
    # answer is the status: 200 true, a 4xx false (Triton's 400), never a 5xx.
    app.state.draining = True
    assert (await client.get("/v2/health/ready")).status_code == 400
    app.state.draining = False
    assert (await client.get("/v2/health/ready")).status_code == 200
    app.state.shutting_down = True
    not_ready = await client.get("/v2/health/ready")
    assert not_ready.status_code == 400 and not_ready.json() == {"ready": False}


async def test_infer_latency_and_errors_are_counted(make_client):
    app, client = make_client(("mlp",))
    await post(client, *infer_body([json_obs(OBS)]))
    await post(client, *infer_body([json_obs(OBS[:, :3])]))
    metrics = (await client.get("/metrics")).text
    assert 'rlserve_request_latency_seconds_count{model="mlp",route="infer"} 1.0' in metrics
    assert 'rlserve_errors_total{code="bad_request",status="400"} 1.0' in metrics


async def test_openapi_documents_every_route_status_and_body(make_client):
    app, client = make_client(("mlp",))
    spec = (await client.get("/openapi.json")).json()
    paths = spec["paths"]
    for path in ("/v2/health/live", "/v2/health/ready", "/v2", "/v2/models/{name}",
                 "/v2/models/{name}/versions/{version}", "/v2/models/{name}/ready",
                 "/v2/models/{name}/versions/{version}/ready"):
        assert "200" in paths[path]["get"]["responses"], path
    for path in ("/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer"):
        operation = paths[path]["post"]
        assert set(operation["responses"]) >= {"200", "400", "404", "413", "500", "503"}
        assert set(operation["requestBody"]["content"]) == {"application/json", "application/octet-stream"}
        assert operation["responses"]["400"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/InferErrorResponse"}
    components = spec["components"]["schemas"]
    assert components["InferRequest"]["required"] == ["inputs"]
    assert components["InferRequestInput"]["properties"]["shape"]["items"]["minimum"] == 0
    assert components["InferErrorResponse"]["properties"] == {"error": {"type": "string"}}


async def test_torchscript_reads_binary_inputs_in_place(make_client):
    """Binary inputs reach the runtime as read-only views of the body; TorchScript serves
    them as ONNX Runtime does."""
    _, onnx = make_client(("mlp",), runtime="onnx")
    _, torchscript = make_client(("mlp",), runtime="torchscript")
    body, headers = infer_body([binary_obs(OBS)], OBS.tobytes(), parameters={"explore": False},
                               outputs=[{"name": "action"}, {"name": "logp"}])
    answers = [split(await post(client, body, headers))[0]["outputs"] for client in (onnx, torchscript)]
    assert answers[0][0]["data"] == answers[1][0]["data"]
    np.testing.assert_allclose(answers[0][1]["data"], answers[1][1]["data"], rtol=1e-5)


async def test_every_refusal_under_v2_has_the_protocol_shape(make_client):
    """Routing refusals too (an unknown path, a wrong method), not only the handlers'."""
    _, client = make_client(("mlp",))
    assert "no route GET /v2/models/mlp/stats" in refusal(await client.get("/v2/models/mlp/stats"), 404)
    assert "not allowed" in refusal(await client.get("/v2/models/mlp/infer"), 405)
    assert "not allowed" in refusal(await client.post("/v2/health/live"), 405)
    unknown_v1 = await client.get("/v1/models/mlp/stats")  # the JSON API keeps its own shape
    assert unknown_v1.status_code == 404 and unknown_v1.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("kept, served", [
    ([0, [2.5, -0.5], -1.5, 0.75, None, [0.1, 0.2, 0.3, 0.4]], True),  # a raw sample outside Box(-1, 1)
    ([0, [0.1, 0.2], 0.5, None, None, [0.1, 0.2]], False),  # two dist_inputs of four
    ([0, "junk", 0.5, None, None, None], False),
], ids=["raw-sample", "dist-width", "junk-action"])
async def test_a_retry_answers_an_imported_kept_answer_only_if_the_policy_could_have_given_it(make_client, kept,
                                                                                                 served):
    """A sequence imported (``PUT .../sessions/{id}``) with a forged kept answer: one this
    policy could have given is the retry's answer, in the protocol's tensors; one it could
    not is the step index's refusal (400 in this protocol), where the tensors once failed to
    build (a 500)."""
    from svc_session_steps import forge_answer

    _, client = make_client(("lstm",))
    obs = np.random.default_rng(6).uniform(-1, 1, (2, 4)).astype(np.float32)
    assert (await post(client, *_sequence_step(0, obs), model="lstm")).status_code == 200
    exported = (await client.get("/v1/models/lstm/sessions/r", headers={"accept": "application/octet-stream"})).content
    imported = await client.put("/v1/models/lstm/sessions/r2", content=forge_answer(exported, kept),
                                headers={"content-type": "application/octet-stream"})
    assert imported.status_code == 200, imported.text
    body, headers = _sequence_step(1, obs, sequence_id="r2", step=0)
    retry = await post(client, body, headers, model="lstm")
    if not served:
        assert "has answered 1 steps" in refusal(retry)  # the protocol answers conflicts 400
        return
    outputs = {o["name"]: o["data"] for o in split(retry)[0]["outputs"]}
    assert outputs["action"] == [2.5, -0.5] and outputs["logp"] == [-1.5] and outputs["value"] == [0.75]
    assert outputs["dist_inputs"] == pytest.approx([0.1, 0.2, 0.3, 0.4])
