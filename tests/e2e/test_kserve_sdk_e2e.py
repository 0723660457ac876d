"""The Open Inference Protocol end to end with the kserve SDK's own clients.

A real uvicorn process serves the bundles of the tritonclient tests (a stateless MLP, a
Dict observation carrying an action mask, an LSTM reading previous actions and rewards)
over REST and gRPC. ``kserve.InferenceRESTClient`` (protocol v2) and
``kserve.InferenceGRPCClient`` drive it from a subprocess (``kserve_sdk_client.py``: the
SDK and tritonclient's gRPC module cannot share one Python process), with binary tensor data
on and off and sequences. Every answer is compared with what the JSON API of the same server
answers for the same observations.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from server_process import free_port, running_server
from test_kserve_v2_e2e import MASKS, act, f32
from test_kserve_v2_e2e import repo as repo  # noqa: F401 (the module's bundles, a fixture)

pytestmark = pytest.mark.e2e

CLIENT = Path(__file__).with_name("kserve_sdk_client.py")
MLP_OBS = np.random.default_rng(31).uniform(-1, 1, (5, 4)).astype(np.float32)
FEATURES = np.random.default_rng(32).uniform(-1, 1, (4, 3)).astype(np.float32)
LSTM_OBS = np.random.default_rng(33).uniform(-1, 1, (5, 4)).astype(np.float32)


def _tensor(name: str, arr: np.ndarray, binary: bool) -> dict[str, Any]:
    datatype = {np.dtype(np.float32): "FP32", np.dtype(np.bool_): "BOOL"}[arr.dtype]
    return {"name": name, "datatype": datatype, "shape": list(arr.shape), "data": arr.ravel().tolist(),
            "binary": binary}


def _infer(transport: str, model: str, inputs: list[dict], *, outputs: list[str] | None = None, binary: bool = True,
           parameters: dict | None = None, request_id: str | None = None) -> dict[str, Any]:
    return {"kind": "infer", "transport": transport, "model": model, "inputs": inputs,
            "outputs": None if outputs is None else [{"name": n, "binary": binary} for n in outputs],
            "parameters": parameters, "id": request_id}


def _sequence(transport: str, sequence_id: int | str, binary: bool) -> list[dict[str, Any]]:
    """An LSTM episode: sequence_start, rewards from the second step, sequence_end, and
    then one more step without a start (refused: the sequence ended)."""
    calls = []
    for t, obs in enumerate(LSTM_OBS):
        inputs = [_tensor("obs", obs[None], binary)]
        if t:
            inputs.append(_tensor("reward", np.array([0.5 * t], np.float32), binary))
        calls.append(_infer(transport, "lstm", inputs, outputs=["action", "logp", "value"], binary=binary,
                            parameters={"explore": False, "sequence_id": sequence_id, "sequence_start": t == 0,
                                        "sequence_end": t == len(LSTM_OBS) - 1}))
    calls.append(_infer(transport, "lstm", [_tensor("obs", LSTM_OBS[:1], binary)],
                        parameters={"sequence_id": sequence_id}))
    return calls


# Every call the SDK makes, by label, run in one subprocess (its start and imports cost ~2 s).
CALLS: dict[str, Any] = {
    "health": {"kind": "health", "models": ["mlp", "lstm", "no-such-model"]},
    **{f"mlp-{transport}-{'binary' if binary else 'json'}": _infer(
        transport, "mlp", [_tensor("obs", MLP_OBS, binary)], outputs=["action", "logp", "value"], binary=binary,
        parameters={"explore": False}, request_id=f"kserve-{transport}-{binary}")
        for transport in ("rest", "grpc") for binary in (True, False)},
    "mlp-rest-default-outputs": _infer("rest", "mlp", [_tensor("obs", MLP_OBS, True)], parameters={"explore": False}),
    **{f"masked-{transport}": _infer(
        transport, "masked", [_tensor("obs.action_mask", MASKS, True), _tensor("obs.observations", FEATURES, True)],
        outputs=["action", "logp"], parameters={"explore": False}) for transport in ("rest", "grpc")},
    "unknown-model-rest": _infer("rest", "no-such-model", [_tensor("obs", MLP_OBS, True)]),
    "unknown-model-grpc": _infer("grpc", "no-such-model", [_tensor("obs", MLP_OBS, True)]),
    "wrong-shape-rest": _infer("rest", "mlp", [_tensor("obs", MLP_OBS[:, :3], True)]),
}
SEQUENCES = {"rest-binary": _sequence("rest", 5_000, True), "rest-json": _sequence("rest", 5_001, False),
             "grpc": _sequence("grpc", "kserve-grpc-sequence", True)}


@pytest.fixture(scope="module")
def answers(repo: Path) -> Iterator[tuple[str, dict[str, Any]]]:  # noqa: F811
    """(HTTP base URL, the SDK's answer to each call by label)."""
    port = free_port()
    with running_server(["--repository", str(repo), "--grpc-port", str(port)],
                        env={"RLSERVE_MAX_BATCH_DELAY_MS": "1"}) as base:
        labels = list(CALLS) + [f"seq-{name}-{i}" for name, calls in SEQUENCES.items() for i in range(len(calls))]
        calls = list(CALLS.values()) + [call for calls in SEQUENCES.values() for call in calls]
        plan = json.dumps({"rest": base, "grpc": f"127.0.0.1:{port}", "calls": calls})
        proc = subprocess.run([sys.executable, str(CLIENT)], input=plan, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        got = json.loads(proc.stdout)
        assert len(got) == len(labels)
        yield base, dict(zip(labels, got, strict=True))


def _outputs(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    assert "error" not in answer, answer
    return answer["outputs"]


def test_health_and_readiness_over_rest_and_grpc(answers):
    health = answers[1]["health"]
    assert health["rest_live"] is True and health["rest_ready"] is True
    assert health["grpc_live"] is True and health["grpc_ready"] is True
    assert health["rest_models"] == {"mlp": True, "lstm": True, "no-such-model": False}
    # an unknown model is not ready (ModelReady answers ready=false over gRPC, as Triton does)
    assert health["grpc_models"] == {"mlp": True, "lstm": True, "no-such-model": False}


@pytest.mark.parametrize("transport", ["rest", "grpc"])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_mlp_answers_equal_the_json_api(answers, transport, binary):
    base, got = answers
    answer = got[f"mlp-{transport}-{'binary' if binary else 'json'}"]
    outputs = _outputs(answer)
    expected = act(base, "mlp", {"observations": MLP_OBS.tolist(), "explore": False, "outputs": ["value"]})
    assert outputs["action"]["datatype"] == "INT64" and outputs["action"]["shape"] == [len(MLP_OBS)]
    assert outputs["action"]["data"] == expected["actions"]
    np.testing.assert_array_equal(f32(outputs["logp"]["data"]), f32(expected["logp"]))
    np.testing.assert_array_equal(f32(outputs["value"]["data"]), f32(expected["value"]))
    assert answer["model_name"] == "mlp" and answer["id"] == f"kserve-{transport}-{binary}"
    if transport == "grpc":  # the SDK's REST parser drops model_version
        assert answer["model_version"] == "1"
    else:  # binary outputs come back as binary data exactly when they were asked for
        assert answer["binary_body"] is binary


def test_outputs_default_to_action_and_logp(answers):
    base, got = answers
    outputs = _outputs(got["mlp-rest-default-outputs"])
    assert list(outputs) == ["action", "logp"]
    expected = act(base, "mlp", {"observations": MLP_OBS.tolist(), "explore": False})
    assert outputs["action"]["data"] == expected["actions"]


@pytest.mark.parametrize("transport", ["rest", "grpc"])
def test_a_dict_observation_with_its_action_mask_equals_the_json_api(answers, transport):
    base, got = answers
    outputs = _outputs(got[f"masked-{transport}"])
    rows = [{"action_mask": m.tolist(), "observations": f.tolist()} for m, f in zip(MASKS, FEATURES, strict=True)]
    expected = act(base, "masked", {"observations": rows, "explore": False})
    assert outputs["action"]["shape"] == [len(MASKS), 2]  # MultiDiscrete([2, 3])
    actions = np.asarray(outputs["action"]["data"]).reshape(len(MASKS), 2)
    assert actions.tolist() == expected["actions"]
    np.testing.assert_array_equal(f32(outputs["logp"]["data"]), f32(expected["logp"]))
    for mask, action in zip(MASKS, actions, strict=True):
        assert mask[action[0]] == 1 and mask[2 + action[1]] == 1


@pytest.mark.parametrize("name", list(SEQUENCES))
def test_an_lstm_sequence_steps_like_a_json_session(answers, name):
    """sequence_start creates the session, each step feeds the stored state and the reward,
    sequence_end ends it: step for step what a JSON session does; a step after the end is
    refused until a new start."""
    base, got = answers
    session = f"json-reference-{name}"
    for t, obs in enumerate(LSTM_OBS):
        body: dict[str, Any] = {"observation": obs.tolist(), "session_id": session, "explore": False,
                                "outputs": ["value"]}
        if t == 0:
            body["episode_start"] = True
        else:
            body["reward"] = 0.5 * t
        expected = act(base, "lstm", body)
        outputs = _outputs(got[f"seq-{name}-{t}"])
        np.testing.assert_array_equal(f32(outputs["action"]["data"]), f32([expected["action"]]).ravel())
        np.testing.assert_array_equal(f32(outputs["logp"]["data"]), f32([expected["logp"]]))
        np.testing.assert_array_equal(f32(outputs["value"]["data"]), f32([expected["value"]]))
    after_end = got[f"seq-{name}-{len(LSTM_OBS)}"]["error"]
    assert after_end["status"] == ("FAILED_PRECONDITION" if name == "grpc" else 400), after_end
    assert "sequence_start" in after_end["message"]


def test_refusals_reach_the_sdk_with_the_protocol_status_and_name_what_was_wrong(answers):
    got = answers[1]
    rest = got["unknown-model-rest"]["error"]
    assert rest["status"] == 404 and "no-such-model" in rest["message"]
    grpc_error = got["unknown-model-grpc"]["error"]
    assert grpc_error["status"] == "NOT_FOUND" and "no-such-model" in grpc_error["message"]
    shape = got["wrong-shape-rest"]["error"]
    assert shape["status"] == 400 and "obs" in shape["message"] and "[-1, 4]" in shape["message"]
