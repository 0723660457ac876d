"""New-API-stack checkpoints served in one command answer over HTTP as RLlib did.

One real ``rlserve serve`` process is started with ``--checkpoint NAME=DIR`` for every module
of every case of ``newstack_cases`` (RLSERVE_NEWSTACK_DIR plus tests/fixtures/newstack): the
algorithm directory of a single-agent case, each module's own directory of a multi-agent
one. Its export cache holds, under the keys the server computes for those arguments, the
``rlserve export`` bundles of the modules that the conformance tests check (made once per
run, ``exported_module``), so it starts as on its second start of the same checkpoints,
without exporting them again; the second server below exports a checkpoint itself (the
admin API's load), as does ``test_newstack_multiagent_e2e.py``. It is asked:

- the recorded observations, each from a fresh episode, deterministic: the module's action
  (``raw_action``) equals RLlib's, ``action`` equals what RLlib handed the environment
  (after NormalizeAndClipActions), and dist inputs (Q-values), value and logp match;
- episodes (recurrent modules, frame stacks): stepped in a server-side session that keeps
  the state, the previous actions (reported as RLlib's sampled ones) and rewards and the
  frames, with the connectors applied by the server; every step's dist inputs and value.

A second server serves one recurrent case exported with ``rlserve export`` from a
repository, its sessions in a real redis-server, and steps the episode over the Open
Inference Protocol (KServe v2); ``rlserve inspect`` names the stack and the module, and the
checkpoint itself loads over the admin API.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from newstack_cases import (
    NewStackCase,
    assert_close,
    check_value_and_logp,
    episode_ids,
    episode_step_body,
    exported_module,
    json_leaves,
    json_row,
    load_case,
    module_checkpoint,
    module_pairs,
    newstack_dir,
    served_name,
)
from server_process import rlserve_command, running_server

from rlserve.models.export.bundle import load_bundle
from rlserve.service.serving import export_cache

pytestmark = pytest.mark.e2e

CHUNK = 25  # observations per request (images as JSON lists are large)


def _name(case_id: str, module_id: str) -> str:
    return served_name(load_case(case_id), module_id)


def _checkpoint_arg(case: NewStackCase, module_id: str) -> str:
    return f"{served_name(case, module_id)}={module_checkpoint(case, module_id)}"


def _kept_exports(tmp_path_factory: pytest.TempPathFactory, pairs: list[tuple[str, str]]) -> Path:
    """An export cache of this server's own holding each module's bundle under the key the
    server computes for its ``--checkpoint`` argument (never the user's cache, nor one an
    earlier run left)."""
    cache = tmp_path_factory.mktemp("export-cache")
    for case_id, module_id in pairs:
        case = load_case(case_id)
        key = export_cache.export_key(module_checkpoint(case, module_id), served_name(case, module_id), None)
        shutil.copytree(exported_module(tmp_path_factory, case, module_id), cache / key)
    return cache


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    pairs = module_pairs()
    if not pairs:
        pytest.fail(f"no new-stack cases found: set RLSERVE_NEWSTACK_DIR (looked in {newstack_dir()})")
    args = [a for case_id, module_id in pairs
            for a in ("--checkpoint", _checkpoint_arg(load_case(case_id), module_id))]
    env = {"RLSERVE_EXPORT_CACHE": str(_kept_exports(tmp_path_factory, pairs))}
    with running_server(args, env=env, start_timeout=60.0 * len(pairs)) as url, \
            httpx.Client(base_url=url, timeout=120) as client:
        yield client


def _act(client: httpx.Client, name: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(f"/v1/models/{name}/act", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def _same(actual: Any, expected: Any, what: str) -> None:
    assert_close(json_leaves(actual), json_leaves(expected), what)


def _agent_of(case: NewStackCase, module_id: str) -> str | None:
    if not case.multi_agent:
        return None
    return next(k.removeprefix("agent_") for k, v in case.reference["fixed"].items()
                if k.startswith("agent_") and v["module_id"] == module_id)


@pytest.mark.parametrize(("case_id", "module_id"), module_pairs() or [("<none>", "")])
def test_fixed_observations_over_http(server: httpx.Client, case_id: str, module_id: str) -> None:
    case = load_case(case_id)
    agent = _agent_of(case, module_id)
    fixed, observations = case.fixed(agent), case.observations(agent)
    q_policy = "q_values" in fixed
    outputs = ["raw_action", "value", "dist_inputs", *(["q_values"] if q_policy else [])]
    for start in range(0, len(observations), CHUNK):
        got = _act(server, _name(case_id, module_id), {"observations": observations[start:start + CHUNK],
                                                         "explore": False, "outputs": outputs})
        for j, i in enumerate(range(start, start + len(got["actions"]))):
            where = f"{case_id}:{module_id} fixed[{i}]"
            _same(got["raw_action"][j], json_row(fixed, "action", i), f"{where}: module action")
            _same(got["actions"][j], json_row(fixed, "action_for_env", i), f"{where}: action for the env")
            reference = fixed["q_values"] if q_policy else fixed["action_dist_inputs"]
            assert_close(got["q_values" if q_policy else "dist_inputs"][j], reference[i], f"{where}: dist inputs")
            check_value_and_logp(got, j, fixed, i, where)


@pytest.mark.parametrize("case_id", episode_ids() or ["<none>"])
def test_episode_over_http_in_a_session(server: httpx.Client, case_id: str) -> None:
    case = load_case(case_id)
    episode = case.reference["episode"]
    name, session = _name(case_id, case.module_ids[0]), f"episode-{case.path.name}"
    for t in range(len(episode["obs"])):
        got = _act(server, name, episode_step_body(episode, t, session, outputs=["raw_action", "value", "dist_inputs"]))
        where = f"{case_id} step {t}"
        assert_close(got["dist_inputs"], episode["action_dist_inputs"][t], f"{where}: dist inputs")
        assert_close(got["value"], episode["full_module_replay"]["value"][t], f"{where}: value")


# --------------------------------------------------------------------------- exported, Redis, KServe v2

def _load_checkpoint_over_the_admin_api(client: httpx.Client, case: NewStackCase, repo: Path) -> None:
    """A new-stack checkpoint copied into the repository loads over the admin API (exported in
    the server) and answers RLlib's first fixed observation."""
    shutil.copytree(case.checkpoint, repo / "from-checkpoint", copy_function=shutil.copyfile)
    headers = {"Authorization": "Bearer t"}
    loaded = client.post("/v1/admin/models", json={"path": "from-checkpoint"}, headers=headers, timeout=600)
    assert loaded.status_code == 201, loaded.text
    fixed = case.fixed()
    got = _act(client, loaded.json()["name"], {"observation": case.observations()[0], "explore": False,
                                               "outputs": ["dist_inputs"]})
    assert_close(got["dist_inputs"], fixed["action_dist_inputs"][0], "admin-loaded checkpoint: dist inputs")


def _kserve_inputs(obs: Any, t: int, episode: dict[str, Any], prev: Any) -> list[dict[str, Any]]:
    arr = np.asarray(obs, np.float32)[None]
    inputs = [{"name": "obs", "datatype": "FP32", "shape": list(arr.shape), "data": arr.ravel().tolist()}]
    if t > 0 and prev.n_prev_actions:
        inputs.append({"name": "prev_action", "datatype": "INT64", "shape": [1],
                       "data": [int(np.ravel(episode["action"][t - 1])[0])]})
    if t > 0 and prev.n_prev_rewards:
        inputs.append({"name": "reward", "datatype": "FP32", "shape": [1], "data": [float(episode["reward"][t - 1])]})
    return inputs


def _kserve_case_ids() -> list[str]:
    """One episode case with a Discrete action and a Box observation, preferring one whose
    connectors add previous actions and rewards."""
    candidates = []
    for case_id in episode_ids():
        ref = load_case(case_id).reference
        module = ref["modules"][ref["module_ids"][0]]
        env_obs = ref.get("env_to_module_pipeline", {}).get("input_observation_space", module["observation_space"])
        if module["action_space"]["type"] == "Discrete" and env_obs.get("type") == "Box":
            prev = "PrevActionsPrevRewards" in (ref.get("env_to_module_user_connectors") or [])
            candidates.append((not prev, case_id))
    return [min(candidates)[1]] if candidates else []


@pytest.mark.parametrize("case_id", _kserve_case_ids() or ["<none>"])
def test_an_exported_bundle_steps_an_episode_over_kserve_v2_with_sessions_in_redis(
        case_id: str, tmp_path: Path, redis_server) -> None:
    case = load_case(case_id)
    repo = tmp_path / "repo"
    out = repo / "policy"
    done = subprocess.run([*rlserve_command(), "export", str(case.checkpoint), "--out", str(out), "--quiet"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    shown = subprocess.run([*rlserve_command(), "inspect", str(out)], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "RLlib new API stack (RLModule): module 'default_policy'" in shown.stdout
    episode = case.reference["episode"]
    prev = load_bundle(out).manifest.signature.prev
    env = {"RLSERVE_REPOSITORY": str(repo), "RLSERVE_SESSION_STORE": redis_server.url, "RLSERVE_ADMIN_TOKEN": "t",
           "RLSERVE_EXPORT_CACHE": str(tmp_path / "export-cache")}
    with running_server([], env=env) as url, httpx.Client(base_url=url, timeout=60) as client:
        metadata = client.get("/v2/models/policy").json()
        assert {i["name"] for i in metadata["inputs"]} >= {"obs"}, metadata
        _load_checkpoint_over_the_admin_api(client, case, repo)
        for t, obs in enumerate(episode["obs"]):
            body = {"inputs": _kserve_inputs(obs, t, episode, prev),
                    "outputs": [{"name": "dist_inputs"}, {"name": "value"}],
                    "parameters": {"sequence_id": "ep-1", "sequence_start": t == 0, "explore": False}}
            response = client.post("/v2/models/policy/infer", json=body)
            assert response.status_code == 200, response.text
            got = {o["name"]: o["data"] for o in response.json()["outputs"]}
            assert_close(got["dist_inputs"], episode["action_dist_inputs"][t], f"{case_id} step {t}: dist inputs")
            assert_close(got["value"], episode["full_module_replay"]["value"][t], f"{case_id} step {t}: value")
