"""A Q-policy and an autoregressive policy exported from RLlib's recorded cases, served by a
real ``rlserve serve`` process (cases chosen by kind, never by name).

- Q-policy: greedy actions equal the argmax of RLlib's recorded Q-values, the Q-values come
  back as ``dist_inputs``, greedy logp is 0, a request's epsilon = 1 gives log(1/n).
- Autoregressive: a seeded session's sampled actions replay under the same seed; the
  deterministic actions are RLlib's.
"""

from __future__ import annotations

import shutil

import httpx
import numpy as np
import pytest
from conformance.test_export import _export_case
from oracle import OracleCase, load_case, read_meta, select_cases
from server_process import running_server

pytestmark = pytest.mark.e2e


def _first_case(kind: str) -> OracleCase:
    names = select_cases(lambda n: read_meta(n)["kind"] == kind)
    if not names or names[0].startswith("<no cases"):
        pytest.fail(f"no oracle case of kind {kind!r}")
    return load_case(names[0])


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repo = tmp_path_factory.mktemp("heads_repo")
    cases = {kind: _first_case(kind) for kind in ("q_model", "autoregressive")}
    for case in cases.values():
        work = tmp_path_factory.mktemp(case.name)
        _export_case(case, work)
        shutil.move(str(work / "bundle"), str(repo / case.name))
    with running_server(["--repository", str(repo)], env={"RLSERVE_MAX_BATCH_DELAY_MS": "1"}) as url:
        with httpx.Client(base_url=url, timeout=30) as client:
            yield client, cases


def _act(client: httpx.Client, name: str, body: dict) -> dict:
    reply = client.post(f"/v1/models/{name}/act", json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_q_policy_greedy_actions_are_the_argmax_of_rllibs_q_values(served) -> None:
    client, cases = served
    case = cases["q_model"]
    q_values = case.io["q_values"]
    body = {"observations": case.io["obs"].tolist(), "explore": False, "outputs": ["dist_inputs"]}
    answer = _act(client, case.name, body)
    assert answer["actions"] == np.argmax(q_values, axis=1).tolist() == case.io["greedy_action"].tolist()
    np.testing.assert_allclose(answer["dist_inputs"], q_values, rtol=1e-5, atol=1e-5)
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
