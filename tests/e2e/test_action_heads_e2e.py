"""A Q-policy and an autoregressive policy exported from RLlib's recorded cases, served by a
real ``rlserve serve`` process (cases chosen by kind, never by name).

- Q-policy: greedy actions equal the argmax of RLlib's recorded Q-values, the Q-values come
  back as ``q_values`` (and, as before, ``dist_inputs``), greedy logp is 0, a request's
  epsilon = 1 gives log(1/n). The same through the Open Inference Protocol with Triton's
  own client: ``epsilon`` as a request parameter, ``q_values`` as an output tensor, and a
  seeded epsilon-greedy sequence replays.
- Autoregressive: a seeded session's sampled actions replay under the same seed; the
  deterministic actions are RLlib's.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from conformance.test_export import _export_case
from oracle import OracleCase, load_case, read_meta, select_cases
from server_process import running_server
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e


def _first_case(kind: str) -> OracleCase:
    names = select_cases(lambda n: read_meta(n)["kind"] == kind)
    if not names or names[0].startswith("<no cases"):
        pytest.fail(f"no oracle case of kind {kind!r}")
    return load_case(names[0])


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[str, dict[str, OracleCase]]]:
    repo = tmp_path_factory.mktemp("heads_repo")
    cases = {kind: _first_case(kind) for kind in ("q_model", "autoregressive")}
    for case in cases.values():
        work = tmp_path_factory.mktemp(case.name)
        _export_case(case, work)
        shutil.move(str(work / "bundle"), str(repo / case.name))
    with running_server(["--repository", str(repo)], env={"RLSERVE_MAX_BATCH_DELAY_MS": "1"}) as url:
        yield url, cases


@pytest.fixture(scope="module")
def served(server):
    url, cases = server
    with httpx.Client(base_url=url, timeout=30) as client:
        yield client, cases


@pytest.fixture
def triton_client(server) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(server[0].removeprefix("http://"))
    yield client
    client.close()


def _act(client: httpx.Client, name: str, body: dict) -> dict:
    reply = client.post(f"/v1/models/{name}/act", json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_q_policy_greedy_actions_are_the_argmax_of_rllibs_q_values(served) -> None:
    client, cases = served
    case = cases["q_model"]
    q_values = case.io["q_values"]
    body = {"observations": case.io["obs"].tolist(), "explore": False, "outputs": ["q_values", "dist_inputs"]}
    answer = _act(client, case.name, body)
    assert answer["actions"] == np.argmax(q_values, axis=1).tolist() == case.io["greedy_action"].tolist()
    assert answer["actions"] == np.argmax(answer["q_values"], axis=1).tolist()
    np.testing.assert_allclose(answer["q_values"], q_values, rtol=1e-5, atol=1e-5)
    assert answer["dist_inputs"] == answer["q_values"]
    assert answer["logp"] == [0.0] * len(q_values)

    n = q_values.shape[1]
    explored = _act(client, case.name, {**body, "explore": True, "epsilon": 1.0})
    np.testing.assert_allclose(explored["logp"], np.log(1.0 / n), rtol=1e-6)
    assert all(0 <= a < n for a in explored["actions"])


def test_epsilon_is_refused_where_it_means_nothing(served) -> None:
    client, cases = served
    for case, epsilon in ((cases["autoregressive"], 0.1), (cases["q_model"], 1.5)):
        reply = client.post(f"/v1/models/{case.name}/act",
                            json={"observation": case.io["obs"][0].tolist(), "epsilon": epsilon})
        assert reply.status_code == 422, reply.text
        assert reply.json()["error"]["field"] == "epsilon"


def test_q_values_of_one_row_and_their_refusal_elsewhere(served) -> None:
    client, cases = served
    q_case, ar_case = cases["q_model"], cases["autoregressive"]
    one = _act(client, q_case.name, {"observation": q_case.io["obs"][3].tolist(), "outputs": ["q_values"]})
    np.testing.assert_allclose(one["q_values"], q_case.io["q_values"][3], rtol=1e-5, atol=1e-5)
    assert "dist_inputs" not in one
    masked = _act(client, q_case.name, {"observation": q_case.io["obs"][3].tolist(), "explore": False,
                                        "action_mask": [1, 0, 1, 0], "outputs": ["q_values"]})
    assert masked["action"] == int(np.argmax(masked["q_values"])) in (0, 2)
    # A retried step (step index) is answered from its kept answer, q_values included.
    _act(client, q_case.name, {"observation": q_case.io["obs"][0].tolist(), "session_id": "q", "episode_start": True,
                               "seed": 5, "step": 0})
    step_1 = {"observation": q_case.io["obs"][1].tolist(), "session_id": "q", "step": 1, "outputs": ["q_values"]}
    first, again = _act(client, q_case.name, step_1), _act(client, q_case.name, step_1)
    assert again == first and len(first["q_values"]) == 4

    reply = client.post(f"/v1/models/{ar_case.name}/act",
                        json={"observation": ar_case.io["obs"][0].tolist(), "outputs": ["q_values"]})
    assert reply.status_code == 422, reply.text
    error = reply.json()["error"]
    assert error["field"] == "outputs" and error["received"] == "q_values"
    reply = client.post(f"/v1/models/{q_case.name}/act",
                        json={"observation": q_case.io["obs"][0].tolist(), "outputs": ["q_value"]})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["field"] == "outputs[0]" and "q_values" in reply.json()["error"]["expected"]


# --------------------------------------------------------------------------- Open Inference Protocol

def _obs_input(obs: np.ndarray, binary: bool = True) -> triton.InferInput:
    inp = triton.InferInput("obs", list(obs.shape), "FP32")
    inp.set_data_from_numpy(obs.astype(np.float32), binary_data=binary)
    return inp


def _outputs(*names: str, binary: bool = True) -> list[triton.InferRequestedOutput]:
    return [triton.InferRequestedOutput(name, binary_data=binary) for name in names]


@pytest.mark.parametrize("binary", [True, False])
def test_infer_greedy_actions_are_the_argmax_of_the_returned_q_values(server, triton_client, binary) -> None:
    _, cases = server
    case = cases["q_model"]
    meta = triton_client.get_model_metadata(case.name)
    assert {"name": "q_values", "datatype": "FP32", "shape": [-1, 4]} in meta["outputs"]
    result = triton_client.infer(case.name, [_obs_input(case.io["obs"], binary)],
                                 outputs=_outputs("action", "logp", "q_values", binary=binary),
                                 parameters={"explore": False})
    q_values, actions = result.as_numpy("q_values"), result.as_numpy("action")
    assert q_values.shape == case.io["q_values"].shape
    np.testing.assert_allclose(q_values, case.io["q_values"], rtol=1e-5, atol=1e-5)
    assert actions.tolist() == np.argmax(q_values, axis=1).tolist() == case.io["greedy_action"].tolist()
    assert result.as_numpy("logp").tolist() == [0.0] * len(actions)


def _infer_episode(client: triton.InferenceServerClient, case: OracleCase, sequence: str, seed: int,
                   epsilon: float) -> tuple[list[int], list[float], np.ndarray]:
    actions, logps, greedy = [], [], []
    for t, row in enumerate(case.io["obs"]):
        parameters = {"explore": True, "epsilon": epsilon, **({"seed": seed} if t == 0 else {})}
        result = client.infer(case.name, [_obs_input(row[None])], outputs=_outputs("action", "logp", "q_values"),
                              sequence_id=sequence, sequence_start=t == 0, sequence_end=t == len(case.io["obs"]) - 1,
                              parameters=parameters)
        actions.append(int(result.as_numpy("action")[0]))
        logps.append(float(result.as_numpy("logp")[0]))
        greedy.append(int(np.argmax(result.as_numpy("q_values")[0])))
    return actions, logps, np.array(greedy)


def test_infer_seeded_epsilon_greedy_sequences_replay(server, triton_client) -> None:
    _, cases = server
    case = cases["q_model"]
    n, epsilon = case.io["q_values"].shape[1], 0.5
    first, logps, greedy = _infer_episode(triton_client, case, "eps-1", seed=5, epsilon=epsilon)
    again, logps_again, _ = _infer_episode(triton_client, case, "eps-2", seed=5, epsilon=epsilon)
    assert (first, logps) == (again, logps_again)
    # logp is that of the epsilon-greedy policy served: greedy (1 - eps) + eps / n, others eps / n.
    took_greedy = np.array(first) == greedy
    expected = np.where(took_greedy, np.log(1 - epsilon + epsilon / n), np.log(epsilon / n))
    np.testing.assert_allclose(logps, expected, rtol=1e-5)
    others = [_infer_episode(triton_client, case, f"eps-{3 + i}", seed=6 + i, epsilon=epsilon)[0] for i in range(3)]
    assert any(o != first for o in others), "different seeds never changed a 16-step epsilon-greedy episode"
    # epsilon 0 explores nothing: every action greedy, whatever the seed.
    zero, zero_logps, zero_greedy = _infer_episode(triton_client, case, "eps-0", seed=5, epsilon=0)
    assert zero == zero_greedy.tolist() and zero_logps == [0.0] * len(zero)


@pytest.mark.parametrize("epsilon", [1.5, -0.1, "0.5", True])
def test_infer_epsilon_out_of_range_or_not_a_number_is_refused(server, triton_client, epsilon) -> None:
    case = server[1]["q_model"]
    with pytest.raises(InferenceServerException) as info:
        triton_client.infer(case.name, [_obs_input(case.io["obs"][:1])], parameters={"epsilon": epsilon})
    assert info.value.status() == "400"
    assert "parameters.epsilon" in info.value.message() and "[0, 1]" in info.value.message()


def test_infer_epsilon_and_q_values_are_refused_for_a_model_without_q_values(server, triton_client) -> None:
    case = server[1]["autoregressive"]
    obs = [_obs_input(case.io["obs"][:2])]
    assert "q_values" not in [o["name"] for o in triton_client.get_model_metadata(case.name)["outputs"]]
    with pytest.raises(InferenceServerException) as info:
        triton_client.infer(case.name, obs, parameters={"epsilon": 0.1})
    assert info.value.status() == "400" and "'parameters.epsilon'" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        triton_client.infer(case.name, obs, outputs=_outputs("q_values"))
    assert info.value.status() == "400" and "q_values" in info.value.message()


def _episode(client: httpx.Client, case: OracleCase, session: str, seed: int) -> list:
    created = client.post(f"/v1/models/{case.name}/sessions", json={"session_id": session, "seed": seed})
    assert created.status_code in (200, 201), created.text
    actions = [_act(client, case.name, {"observation": row.tolist(), "session_id": session, "explore": True})["action"]
               for row in case.io["obs"]]
    assert client.delete(f"/v1/models/{case.name}/sessions/{session}").status_code in (200, 204)
    return actions


def test_autoregressive_seeded_samples_replay(served) -> None:
    client, cases = served
    case = cases["autoregressive"]
    first = _episode(client, case, "ar-1", seed=11)
    again = _episode(client, case, "ar-2", seed=11)
    assert first == again
    assert all(len(a) == 2 and set(a) <= {0, 1} for a in first)
    other = [_episode(client, case, f"ar-{3 + i}", seed=12 + i) for i in range(3)]
    assert any(o != first for o in other), "different seeds never changed a 16-step episode"

    mode = _act(client, case.name, {"observations": case.io["obs"].tolist(), "explore": False})
    expected = np.stack([case.io["dist/deterministic_sample/0"], case.io["dist/deterministic_sample/1"]], 1)
    assert mode["actions"] == expected.tolist()
    np.testing.assert_allclose(mode["logp"], case.io["dist/deterministic_sampled_action_logp"], rtol=1e-5, atol=1e-6)
