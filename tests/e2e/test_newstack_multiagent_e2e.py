"""A new-API-stack multi-agent checkpoint served as a policy set answers every agent as RLlib did.

Every multi-agent case of ``newstack_cases`` (RLSERVE_NEWSTACK_DIR plus tests/fixtures/newstack,
chosen by ``reference.json``'s ``multi_agent``, never by name) is served by one real
``rlserve serve`` process twice over:

- ``direct``: the checkpoint itself, ``--policy-set direct=CHECKPOINT --map AGENT=MODULE ...``
  (every module of its MultiRLModule exported at start, each verified);
- ``exported``: the set ``rlserve export CHECKPOINT --mapping FILE`` wrote, whose own mapping
  is checked against the case's before it is served.

The mapping is the case's own record of RLlib's mapping function evaluated
(``policy_mapping.mapping_evaluated``: agent id -> module id). Each recorded observation
row (``fixed.obs[i]``: one observation per agent, each alone from a fresh episode) is one
``agents/act`` request carrying every agent, ``explore=false``: per agent the answering
policy is the module RLlib used, the deterministic action (the module's and the one for
the environment) equals RLlib's, and logp, dist inputs and value are within 1e-5 relative
(1e-5 absolute near zero: the bundle's export tolerance scaled to float32 sums, as
``tests/conformance/test_newstack.py``). The same rows sent inside one episode (every
agent's state on the server) answer the same for feed-forward modules.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from newstack_cases import NewStackCase, assert_close, case_ids, load_case, newstack_dir
from server_process import rlserve_command, running_server

from rlserve.models.multiagent.policy_set import load_policy_set

pytestmark = pytest.mark.e2e

SETS = ("direct", "exported")


def _multi_agent_ids() -> list[str]:
    return [i for i in case_ids() if load_case(i).multi_agent]


def _mapping(case: NewStackCase) -> dict[str, str]:
    """agent id -> module id, as RLlib's mapping function answered when the case was recorded."""
    evaluated = case.reference["policy_mapping"]["mapping_evaluated"]
    return {str(agent): str(module) for agent, module in evaluated.items()}


@pytest.fixture(scope="module", params=_multi_agent_ids() or ["<none>"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    if request.param == "<none>":
        pytest.fail(f"no multi-agent new-stack case found (looked in {newstack_dir()} and tests/fixtures/newstack)")
    case = load_case(request.param)
    mapping = _mapping(case)
    work = tmp_path_factory.mktemp("newstack-multiagent")
    mapping_file = work / "mapping.json"
    mapping_file.write_text(json.dumps({"agents": mapping}))
    exported = work / "team"
    done = subprocess.run([*rlserve_command(), "export", str(case.checkpoint), "--out", str(exported),
                           "--mapping", str(mapping_file), "--formats", "onnx", "--quiet"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    with load_policy_set(exported) as policy_set:  # the set keeps the mapping it was given
        assert policy_set.policy_ids == sorted(set(mapping.values())) == sorted(case.module_ids)
        assert {agent: policy_set.mapping.policy_for(agent) for agent in mapping} == mapping
    args = ["--policy-set", f"direct={case.checkpoint}", *[a for agent, module in mapping.items()
                                                          for a in ("--map", f"{agent}={module}")]]
    serve_exported = ["--policy-set", f"exported={exported}"]
    # An export cache of its own: nothing read from an earlier run's exports.
    env = {"RLSERVE_EXPORT_CACHE": str(work / "export-cache")}
    with running_server(args + serve_exported, env=env, start_timeout=120.0 * len(mapping)) as url, \
            httpx.Client(base_url=url, timeout=120) as client:
        yield case, client


def _act(client: httpx.Client, name: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(f"/v1/models/{name}/agents/act", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def _same_action(actual: Any, expected: Any, what: str) -> None:
    """Discrete actions equal; float actions (a Box's mean) within the tolerance."""
    want = np.asarray(expected)
    if want.dtype.kind == "f":
        assert_close(actual, want, what)
    else:
        assert np.asarray(actual).tolist() == want.tolist(), what


def _check_row(case: NewStackCase, answer: dict[str, Any], i: int, where: str) -> None:
    for agent in _mapping(case):
        fixed, got = case.fixed(agent), answer["agents"][agent]
        what = f"{where} agent {agent} fixed[{i}]"
        assert got["policy"] == fixed["module_id"], what
        _same_action(got["raw_action"], fixed["action"][i], f"{what}: the module's action")
        _same_action(got["action"], fixed["action_for_env"][i], f"{what}: the action for the env")
        assert_close(got["logp"], fixed["logp"][i], f"{what}: logp")
        assert_close(got["dist_inputs"], np.asarray(fixed["action_dist_inputs"][i]).reshape(-1), f"{what}: dist inputs")
        assert_close(got["value"], fixed["value"][i], f"{what}: value")


@pytest.mark.parametrize("set_name", SETS)
def test_every_agent_answers_as_rllib_did(served, set_name: str) -> None:
    case, client = served
    observations = _observations(case)
    for i, row in enumerate(observations):
        answer = _act(client, set_name, {"explore": False, "outputs": ["raw_action", "dist_inputs", "value"],
                                         "agents": {agent: {"observation": obs} for agent, obs in row.items()}})
        assert answer["model"] == set_name and set(answer["agents"]) == set(row)
        _check_row(case, answer, i, set_name)


def test_the_rows_as_steps_of_an_episode_answer_the_same(served) -> None:
    """Each recorded row was fed from a fresh episode: sent as one episode restarted at every
    step, every agent's answer comes from its own session in its policy's store."""
    case, client = served
    episode = f"episode-{Path(case.path).name}"
    steps = _observations(case)[:20]
    for i, row in enumerate(steps):
        answer = _act(client, "direct", {
            "episode_id": episode, "episode_start": True, "episode_end": i == len(steps) - 1, "explore": False,
            "outputs": ["raw_action", "dist_inputs", "value"],
            "agents": {agent: {"observation": obs} for agent, obs in row.items()}})
        assert answer["episode_id"] == episode and answer.get("episode_ended", False) == (i == len(steps) - 1)
        _check_row(case, answer, i, "direct, in one episode")
    assert client.get(f"/v1/models/direct/episodes/{episode}").status_code == 410  # ended with the last step


def _observations(case: NewStackCase) -> list[dict[str, Any]]:
    """The recorded rows, each agent's observation (as RLlib's env emitted it) under its id."""
    agents = list(_mapping(case))
    per_agent = {agent: case.observations(agent) for agent in agents}
    count = len(case.reference["fixed"]["obs"])
    assert count and all(len(rows) == count for rows in per_agent.values())
    return [{agent: per_agent[agent][i] for agent in agents} for i in range(count)]
