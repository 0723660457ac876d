"""The Open Inference Protocol end to end: Triton's own HTTP client against `rlserve serve`.

A real uvicorn process serves three bundles built with the catalog (a stateless MLP, a
Dict observation carrying an action mask, an LSTM reading previous actions and rewards);
``tritonclient.http.InferenceServerClient`` drives them with binary tensor data on and
off, requested outputs and sequences, and every answer is compared with what the JSON API
of the same server answers for the same observations.
"""

from __future__ import annotations

import http.client
import json
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import svc_bundles
import tritonclient.http as triton
from plain_http import HTTP
from server_process import running_server
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("kserve_v2_repo")
    exported = svc_bundles.shared(tmp_path_factory, "mlp", "masked", "lstm")
    for name in ("mlp", "masked", "lstm"):
        shutil.copytree(exported / name, root / name)
    return root


@pytest.fixture(scope="module")
def url(repo: Path) -> Iterator[str]:
    with running_server(["--repository", str(repo)], env={"RLSERVE_MAX_BATCH_DELAY_MS": "1"}) as base:
        yield base


@pytest.fixture
def client(url: str) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(url.removeprefix("http://"))
    yield c
    c.close()


def act(url: str, name: str, body: dict) -> dict:
    response = HTTP.post(f"{url}/v1/models/{name}/act", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def tensor(name: str, arr: np.ndarray, binary: bool) -> triton.InferInput:
    inp = triton.InferInput(name, list(arr.shape), triton.np_to_triton_dtype(arr.dtype))
    inp.set_data_from_numpy(arr, binary_data=binary)
    return inp


def wanted(*names: str, binary: bool) -> list[triton.InferRequestedOutput]:
    return [triton.InferRequestedOutput(name, binary_data=binary) for name in names]


def f32(values) -> np.ndarray:
    """JSON floats of the JSON API back to the float32 the model produced (exact)."""
    return np.asarray(values, dtype=np.float64).astype(np.float32)


# --------------------------------------------------------------------------- health and metadata

def test_health_server_metadata_and_readiness(client):
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "rlserve"
    assert {"binary_tensor_data", "sequence"} <= set(meta["extensions"])
    assert client.is_model_ready("mlp") and client.is_model_ready("lstm", "1")
    assert not client.is_model_ready("no-such-model")


def test_model_metadata_names_every_tensor(client):
    mlp = client.get_model_metadata("mlp")
    assert mlp["name"] == "mlp" and mlp["versions"] == ["1"]
    assert {t["name"]: (t["datatype"], t["shape"]) for t in mlp["inputs"]} == {
        "obs": ("FP32", [-1, 4]), "action_mask": ("BOOL", [-1, 3])}
    assert {t["name"]: (t["datatype"], t["shape"]) for t in mlp["outputs"]} == {
        "action": ("INT64", [-1]), "logp": ("FP32", [-1]), "value": ("FP32", [-1]),
        "entropy": ("FP32", [-1]), "dist_inputs": ("FP32", [-1, 3])}
    masked = client.get_model_metadata("masked", "1")
    assert [t["name"] for t in masked["inputs"]] == ["obs.action_mask", "obs.observations", "action_mask"]
    assert {t["name"]: t["shape"] for t in masked["outputs"]}["action"] == [-1, 2]
    lstm = client.get_model_metadata("lstm")
    assert {t["name"]: (t["datatype"], t["shape"]) for t in lstm["inputs"]} == {
        "obs": ("FP32", [-1, 4]), "prev_action": ("FP32", [-1, 2]), "reward": ("FP32", [-1])}
    assert lstm["parameters"]["optional_inputs"] == ["prev_action", "reward"]
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("no-such-model")
    assert info.value.status() == "404" and "no-such-model" in info.value.message()


# --------------------------------------------------------------------------- stateless MLP

@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("rows", [1, 7])
def test_mlp_answers_equal_the_json_api(client, url, binary, rows):
    obs = np.random.default_rng(rows).uniform(-1, 1, (rows, 4)).astype(np.float32)
    result = client.infer("mlp", [tensor("obs", obs, binary)], outputs=wanted("action", "logp", "value", binary=binary),
                          parameters={"explore": False})
    expected = act(url, "mlp", {"observations": obs.tolist(), "explore": False, "outputs": ["value"]})
    np.testing.assert_array_equal(result.as_numpy("action"), np.asarray(expected["actions"], dtype=np.int64))
    np.testing.assert_array_equal(result.as_numpy("logp"), f32(expected["logp"]))
    np.testing.assert_array_equal(result.as_numpy("value"), f32(expected["value"]))
    action = result.get_output("action")
    assert action["datatype"] == "INT64" and action["shape"] == [rows]
    assert ("binary_data_size" in action.get("parameters", {})) is binary
    assert result.get_response()["model_name"] == "mlp" and result.get_response()["model_version"] == "1"


def test_outputs_default_to_action_and_logp_and_only_requested_ones_come_back(client, url):
    obs = np.random.default_rng(3).uniform(-1, 1, (4, 4)).astype(np.float32)
    everything = client.infer("mlp", [tensor("obs", obs, True)], parameters={"explore": False}, request_id="r-1")
    assert [o["name"] for o in everything.get_response()["outputs"]] == ["action", "logp"]
    assert everything.get_response()["id"] == "r-1"
    only = client.infer("mlp", [tensor("obs", obs, True)], outputs=wanted("entropy", "dist_inputs", binary=False),
                        parameters={"explore": False})
    assert [o["name"] for o in only.get_response()["outputs"]] == ["entropy", "dist_inputs"]
    assert only.as_numpy("action") is None and only.as_numpy("logp") is None
    expected = act(url, "mlp", {"observations": obs.tolist(), "explore": False, "outputs": ["entropy", "dist_inputs"]})
    np.testing.assert_array_equal(only.as_numpy("entropy"), f32(expected["entropy"]))
    np.testing.assert_array_equal(only.as_numpy("dist_inputs"), f32(expected["dist_inputs"]))


def test_float64_observations_are_taken_for_a_float32_box(client, url):
    obs = np.random.default_rng(5).uniform(-1, 1, (3, 4))
    result = client.infer("mlp", [tensor("obs", obs, True)], parameters={"explore": False})
    expected = act(url, "mlp", {"observations": obs.tolist(), "explore": False})
    assert result.as_numpy("action").tolist() == expected["actions"]


# --------------------------------------------------------------------------- Dict observation, masks

MASKS = np.array([[1, 0, 0, 1, 1], [0, 1, 1, 0, 1], [1, 1, 0, 0, 1], [1, 0, 1, 1, 0]], dtype=np.float32)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_dict_observation_with_its_action_mask_equals_the_json_api(client, url, binary):
    features = np.random.default_rng(11).uniform(-1, 1, (4, 3)).astype(np.float32)
    inputs = [tensor("obs.action_mask", MASKS, binary), tensor("obs.observations", features, binary)]
    result = client.infer("masked", inputs, outputs=wanted("action", "logp", "value", binary=binary),
                          parameters={"explore": False})
    rows = [{"action_mask": m.tolist(), "observations": f.tolist()} for m, f in zip(MASKS, features, strict=True)]
    expected = act(url, "masked", {"observations": rows, "explore": False, "outputs": ["value"]})
    np.testing.assert_array_equal(result.as_numpy("action"), np.asarray(expected["actions"], dtype=np.int64))
    np.testing.assert_array_equal(result.as_numpy("logp"), f32(expected["logp"]))
    np.testing.assert_array_equal(result.as_numpy("value"), f32(expected["value"]))
    for mask, action in zip(MASKS, result.as_numpy("action"), strict=True):  # MultiDiscrete([2, 3])
        assert mask[action[0]] == 1 and mask[2 + action[1]] == 1


def test_the_action_mask_tensor_equals_the_json_action_masks(client, url):
    """A separate ``action_mask`` tensor (BOOL) overrides the mask inside the observation,
    as ``action_masks`` does on the JSON API; sampled actions respect it."""
    features = np.random.default_rng(12).uniform(-1, 1, (4, 3)).astype(np.float32)
    in_obs = np.ones((4, 5), np.float32)
    inputs = [tensor("obs.action_mask", in_obs, True), tensor("obs.observations", features, True),
              tensor("action_mask", MASKS.astype(bool), True)]
    result = client.infer("masked", inputs, parameters={"explore": False})
    rows = [{"action_mask": m.tolist(), "observations": f.tolist()} for m, f in zip(in_obs, features, strict=True)]
    expected = act(url, "masked", {"observations": rows, "explore": False, "action_masks": MASKS.astype(int).tolist()})
    assert result.as_numpy("action").tolist() == expected["actions"]
    np.testing.assert_array_equal(result.as_numpy("logp"), f32(expected["logp"]))
    sampled = client.infer("masked", [tensor("obs.action_mask", np.repeat(MASKS, 25, axis=0), True),
                                      tensor("obs.observations", np.repeat(features, 25, axis=0), True)],
                           parameters={"explore": True}).as_numpy("action")
    for mask, action in zip(np.repeat(MASKS, 25, axis=0), sampled, strict=True):
        assert mask[action[0]] == 1 and mask[2 + action[1]] == 1


# --------------------------------------------------------------------------- sequences (LSTM)

def _lstm_observations(steps: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (steps, 4)).astype(np.float32)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_an_lstm_sequence_steps_like_a_json_session(client, url, binary):
    """sequence_start creates the session, each step feeds the stored state, the served
    action and the reward, sequence_end ends it: step for step what a JSON session does."""
    observations = _lstm_observations(6, seed=21)
    sequence_id = 1_000 + binary
    json_session = f"json-lstm-{binary}"
    for t, obs in enumerate(observations):
        inputs = [tensor("obs", obs[None], binary)]
        body: dict = {"observation": obs.tolist(), "session_id": json_session, "explore": False, "outputs": ["value"]}
        if t == 0:
            body["episode_start"] = True
        else:
            reward = np.array([0.5 * t], dtype=np.float32)
            inputs.append(tensor("reward", reward, binary))
            body["reward"] = float(reward[0])
        result = client.infer("lstm", inputs, outputs=wanted("action", "logp", "value", binary=binary),
                              sequence_id=sequence_id, sequence_start=t == 0, sequence_end=t == len(observations) - 1,
                              parameters={"explore": False})
        expected = act(url, "lstm", body)
        np.testing.assert_array_equal(result.as_numpy("action"), f32([expected["action"]]))
        np.testing.assert_array_equal(result.as_numpy("logp"), f32([expected["logp"]]))
        np.testing.assert_array_equal(result.as_numpy("value"), f32([expected["value"]]))
    # sequence_end ended the session: stepping it again is refused until a new start.
    with pytest.raises(InferenceServerException) as info:
        client.infer("lstm", [tensor("obs", observations[:1], binary)], sequence_id=sequence_id)
    assert info.value.status() == "400" and "sequence_start" in info.value.message()
    assert HTTP.get(f"{url}/v1/models/lstm/sessions/{sequence_id}").status_code == 410
    restarted = client.infer("lstm", [tensor("obs", observations[:1], binary)], sequence_id=sequence_id,
                             sequence_start=True, parameters={"explore": False})
    first = act(url, "lstm", {"observation": observations[0].tolist(), "session_id": json_session,
                              "episode_start": True, "explore": False})
    assert restarted.as_numpy("action").tolist() == [first["action"]]


def test_a_seeded_sequence_samples_like_a_seeded_json_session(client, url):
    observations = _lstm_observations(5, seed=22)
    actions = {}
    for side in ("triton", "json"):
        drawn = []
        for t, obs in enumerate(observations):
            if side == "triton":
                result = client.infer(
                    "lstm",
                    [tensor("obs", obs[None], True)],
                    sequence_id="seeded-seq",
                    sequence_start=t == 0,
                    parameters={"explore": True, **({"seed": 7} if t == 0 else {})},
                )
                drawn.append((result.as_numpy("action")[0].tolist(), float(result.as_numpy("logp")[0])))
            else:
                body = {"observation": obs.tolist(), "session_id": "seeded-json", "explore": True}
                if t == 0:
                    body.update(episode_start=True, seed=7)
                answer = act(url, "lstm", body)
                drawn.append((f32(answer["action"]).tolist(), float(f32(answer["logp"]))))
        actions[side] = drawn
    assert actions["triton"] == actions["json"]
    assert len({tuple(a) for a, _ in actions["triton"]}) > 1  # really sampled, not one mode


def test_a_reported_previous_action_is_read_like_the_json_prev_action(client, url):
    observations = _lstm_observations(3, seed=23)
    taken = np.array([[0.25, -0.5]], dtype=np.float32)
    for t, obs in enumerate(observations):
        inputs = [tensor("obs", obs[None], False)]
        body: dict = {"observation": obs.tolist(), "session_id": "prev-json", "explore": False}
        if t == 0:
            body["episode_start"] = True
        else:
            inputs.append(tensor("prev_action", taken, False))
            body["prev_action"] = taken[0].tolist()
        result = client.infer("lstm", inputs, sequence_id="prev-seq", sequence_start=t == 0,
                              parameters={"explore": False})
        expected = act(url, "lstm", body)
        np.testing.assert_array_equal(result.as_numpy("action"), f32([expected["action"]]))


# --------------------------------------------------------------------------- errors

def test_refusals_have_the_protocol_shape_and_name_the_tensor(client, url):
    with pytest.raises(InferenceServerException) as info:
        client.infer("mlp", [tensor("obs", np.zeros((2, 5), np.float32), True)])
    assert info.value.status() == "400"
    message = info.value.message()
    assert "'obs'" in message and "[-1,4]" in message and "[2,5]" in message
    with pytest.raises(InferenceServerException) as info:
        client.infer("mlp", [tensor("obs", np.array([[0.1, np.nan, 0.0, 0.0]], np.float32), True)])
    assert info.value.status() == "400" and "obs" in info.value.message() and "finite" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        client.infer("mlp", [tensor("obs", np.array([[b"a", b"b", b"c", b"d"]], dtype=np.object_), True)])
    assert info.value.status() == "400" and "BYTES" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        client.infer("no-such-model", [tensor("obs", np.zeros((1, 4), np.float32), True)])
    assert info.value.status() == "404"
    response = HTTP.post(f"{url}/v2/models/mlp/infer", content=b"{not json")
    assert response.status_code == 400 and set(response.json()) == {"error"}
    assert isinstance(response.json()["error"], str)


@pytest.mark.parametrize("length", ["\xb2", "1\xb9", "\xb3\xb3"])
def test_a_header_length_of_non_ascii_digits_is_a_400_naming_the_header(url, length):
    # '²' is str.isdigit() but not int(); it used to answer 500. The raw bytes go through
    # uvicorn's own parser to the fast path, as a client would send them.
    body = json.dumps({"inputs": [{"name": "obs", "shape": [1, 4], "datatype": "FP32",
                                   "data": [0.1, 0.2, 0.3, 0.4]}]}).encode()
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest("POST", "/v2/models/mlp/infer")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(body)))
        conn.putheader("Inference-Header-Content-Length", length.encode("latin-1"))
        conn.endheaders(body)
        response = conn.getresponse()
        status, answer = response.status, json.loads(response.read())
    finally:
        conn.close()
    assert status == 400 and set(answer) == {"error"}, answer
    assert "Inference-Header-Content-Length" in answer["error"] and f"[1, {len(body)}]" in answer["error"]


def test_a_refused_sequence_step_leaves_the_session_as_it_was(client, url):
    obs = _lstm_observations(2, seed=24)
    client.infer("lstm", [tensor("obs", obs[:1], True)], sequence_id=77, sequence_start=True)
    steps = HTTP.get(f"{url}/v1/models/lstm/sessions/77").json()["steps"]
    with pytest.raises(InferenceServerException):
        client.infer("lstm", [tensor("obs", obs[1:], True), tensor("reward", np.array([np.inf], np.float32), True)],
                     sequence_id=77)
    assert HTTP.get(f"{url}/v1/models/lstm/sessions/77").json()["steps"] == steps


# --------------------------------------------------------------------------- one batch

# A batch closes at RLSERVE_MAX_BATCH_SIZE rows or when its window ends: with 4 rows and a
# window far longer than the test, a 3-row and a 1-row request share one batch whichever
# comes first and however late the other is (the window only bounds a failure's wait).
BATCH_OF_FOUR = {"RLSERVE_MAX_BATCH_SIZE": "4", "RLSERVE_MAX_BATCH_DELAY_MS": "20000"}


def test_a_protocol_request_and_a_json_request_share_one_batch(repo):
    """Both wire formats end in the same batcher: a tritonclient request and a JSON request
    run as one runtime call."""
    with running_server(["--repository", str(repo)], env=BATCH_OF_FOUR) as base:
        c = triton.InferenceServerClient(base.removeprefix("http://"))
        obs = np.random.default_rng(31).uniform(-1, 1, (3, 4)).astype(np.float32)
        shares_one_batch_with_a_json_request(base, lambda: c.infer("mlp", [tensor("obs", obs, True)]))
        c.close()


def shares_one_batch_with_a_json_request(base: str, send: Callable[[], Any]) -> None:
    """``send()`` (a protocol request of 3 MLP rows, answered as tritonclient answers) and
    a 1-row JSON act request, sent together to a server batching 4 rows (``BATCH_OF_FOUR``),
    ran as one runtime call: the JSON answer's batch and the server's batch metrics say so."""
    results: list = []
    thread = threading.Thread(target=lambda: results.append(send()))
    thread.start()
    answer = act(base, "mlp", {"observation": [0.1, 0.2, 0.3, 0.4], "debug": True})
    thread.join(60)
    assert len(results) == 1 and results[0].as_numpy("action").shape == (3,)
    assert answer["debug"]["batch_requests"] == 2 and answer["debug"]["batch_rows"] == 4
    metrics = HTTP.get(f"{base}/metrics", timeout=30).text
    for line in ('rlserve_batch_size_requests_count{model="mlp"} 1.0',
                 'rlserve_batch_size_requests_sum{model="mlp"} 2.0', 'rlserve_batch_size_rows_sum{model="mlp"} 4.0'):
        assert line in metrics, [m for m in metrics.splitlines() if m.startswith("rlserve_batch_size")]
