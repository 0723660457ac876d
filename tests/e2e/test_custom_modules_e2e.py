"""Custom RLModules (RLlib's own example classes) exported by tracing answer as RLlib did.

Every module of every custom-module case (``RLSERVE_CUSTOM_MODULES_DIR``, default
``../shared/oracle/custom-modules``, plus tests/fixtures/custom-modules) is exported with
``rlserve export --trust-code`` in an environment with RLlib (``tests/ray_venv.py``), then
served from this one, which has no ray:

- the bundle run as the server runs it, ONNX Runtime and TorchScript: RLlib's ``fixed``
  answers (module input, dist inputs, deterministic action, action for the env, logp,
  value, state) and, for stateful modules, the recorded episode step by step;
- a real ``rlserve serve`` of a repository holding the bundles: the same answers over HTTP;
  a stateful module's episode in a session whose store is a real redis-server, the server
  SIGKILLed half-way and a new one going on with the episode;
- a module that masks with its observation's ``action_mask``: the request's own mask applies
  on top, a row that allows nothing is a 422.
"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from newstack_cases import (
    assert_close,
    case_ids,
    check_value_and_logp,
    custom_modules_dir,
    episode_ids,
    episode_step_body,
    json_leaves,
    json_row,
    load_case,
    served_name,
)
from served_bundle import ServedBundle, agent_of, check_episode, check_fixed, dist_inputs_folded
from server_process import ServerProcess, running_server
from traced_exports import export_traced_all, rlserve_in_ray_env

from rlserve.models.export.bundle import load_bundle

pytestmark = pytest.mark.e2e

CHUNK = 25


def _acting_modules(case_id: str) -> list[str]:
    """The modules RLlib acted with: a multi-agent case's agents' (a shared encoder acts for none)."""
    case = load_case(case_id)
    if not case.multi_agent:
        return case.module_ids
    fixed = case.reference["fixed"]
    return sorted({v["module_id"] for k, v in fixed.items() if k.startswith("agent_")})


def _explores_otherwise(case_id: str) -> bool:
    """RLlib recorded other dist inputs for forward_exploration than for forward_inference."""
    return float(load_case(case_id).reference.get("crosscheck", {}).get("forward_exploration_vs_inference_maxdiff",
                                                                         0.0)) > 0.0


def _pairs() -> list[tuple[str, str]]:
    return [(c, m) for c in case_ids("custom") if not _explores_otherwise(c) for m in _acting_modules(c)]


def _require(case_id: str, kind: str) -> None:
    if case_id == "<none>":  # tests/fixtures/custom-modules ships one of every kind
        pytest.fail(f"no {kind} custom-module case in {custom_modules_dir()} nor tests/fixtures/custom-modules")


def _name(case_id: str, module_id: str) -> str:
    return served_name(load_case(case_id), module_id)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not _pairs():
        pytest.fail(f"no custom-module cases found: set RLSERVE_CUSTOM_MODULES_DIR (looked in {custom_modules_dir()})")
    repo = tmp_path_factory.mktemp("traced-repository")
    export_traced_all([(load_case(case_id), module_id, repo / _name(case_id, module_id))
                       for case_id, module_id in _pairs()])
    return repo


@pytest.mark.parametrize("case_id", [c for c in case_ids("custom") if _explores_otherwise(c)] or ["<none>"])
def test_a_module_that_explores_with_other_dist_inputs_is_refused(case_id: str, tmp_path: Path) -> None:
    """One graph serves explore true and false: a module whose forward_exploration differs
    (RLlib's autoregressive example samples its first action there) is refused in one line."""
    _require(case_id, "exploring-differently")
    case = load_case(case_id)
    done = subprocess.run([*rlserve_in_ray_env(), "export", str(case.checkpoint), "--trust-code", "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=900)
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("rlserve export:")]
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert "forward_exploration computes other action_dist_inputs" in lines[0]
    assert not (tmp_path / "out").exists()


def test_the_serving_environment_has_no_ray() -> None:
    """What serves the traced bundles below cannot import ray (nor the modules' code)."""
    assert importlib.util.find_spec("ray") is None


@pytest.mark.parametrize(("case_id", "module_id"), _pairs() or [("<none>", "")])
def test_traced_bundles_match_rllib_in_both_runtimes(repository: Path, case_id: str, module_id: str) -> None:
    case = load_case(case_id)
    bundle = load_bundle(repository / _name(case_id, module_id))  # checksums verified
    assert bundle.manifest.source["exported_by"] == "tracing"
    agent = agent_of(case, module_id)
    fixed, observations = case.fixed(agent), case.observations(agent)
    for runtime in ("onnx", "torchscript"):
        served = ServedBundle(bundle, runtime)
        for i, obs in enumerate(observations):
            served.reset()
            check_fixed(served, served.step(obs), fixed, i, f"{case_id}:{module_id} fixed[{i}] ({runtime})")


@pytest.mark.parametrize("case_id", episode_ids("custom") or ["<none>"])
def test_a_traced_stateful_module_plays_rllibs_episode(repository: Path, case_id: str) -> None:
    _require(case_id, "stateful")
    case = load_case(case_id)
    bundle = load_bundle(repository / _name(case_id, case.module_ids[0]))
    check_episode(ServedBundle(bundle), case.reference["episode"], case_id)


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory):
    env = {"RLSERVE_REPOSITORY": str(repository), "RLSERVE_EXPORT_CACHE": str(tmp_path_factory.mktemp("cache"))}
    with running_server([], env=env, start_timeout=300) as url, httpx.Client(base_url=url, timeout=120) as client:
        yield client


def _act(client: httpx.Client, name: str, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    response = client.post(f"/v1/models/{name}/act", json=body)
    assert response.status_code == status, response.text
    return response.json()


@pytest.mark.parametrize(("case_id", "module_id"), _pairs() or [("<none>", "")])
def test_fixed_observations_over_http(server: httpx.Client, repository: Path, case_id: str, module_id: str) -> None:
    case = load_case(case_id)
    agent = agent_of(case, module_id)
    fixed, observations = case.fixed(agent), case.observations(agent)
    folded = (load_bundle(repository / _name(case_id, module_id)).manifest.source or {}).get("dist_inputs") \
        == "the distribution's parameters"
    for start in range(0, len(observations), CHUNK):
        got = _act(server, _name(case_id, module_id), {"observations": observations[start:start + CHUNK],
                                                         "explore": False,
                                                         "outputs": ["raw_action", "value", "dist_inputs"]})
        for j, i in enumerate(range(start, start + len(got["actions"]))):
            where = f"{case_id}:{module_id} fixed[{i}]"
            for answer, recorded in (("raw_action", "action"), ("actions", "action_for_env")):
                assert_close(json_leaves(got[answer][j]), json_leaves(json_row(fixed, recorded, i)),
                             f"{where}: {answer}")
            if not folded:
                assert_close(got["dist_inputs"][j], fixed["action_dist_inputs"][i], f"{where}: dist inputs")
            check_value_and_logp(got, j, fixed, i, where)


def _episode_step(client: httpx.Client, name: str, session: str, episode: dict[str, Any], t: int) -> None:
    got = _act(client, name, episode_step_body(episode, t, session, step=t, outputs=["value", "dist_inputs"]))
    where = f"{name} step {t}"
    if "action_dist_inputs" in episode:
        assert_close(got["dist_inputs"], episode["action_dist_inputs"][t], f"{where}: dist inputs")
    assert_close(got["value"], episode["full_module_replay"]["value"][t], f"{where}: value")


@pytest.mark.parametrize("case_id", episode_ids("custom") or ["<none>"])
def test_a_stateful_episode_goes_on_across_a_sigkill_with_the_redis_store(
        repository: Path, case_id: str, redis_server, tmp_path: Path) -> None:
    _require(case_id, "stateful")
    case = load_case(case_id)
    name = _name(case_id, case.module_ids[0])
    episode = dict(case.reference["episode"])
    if dist_inputs_folded(ServedBundle(load_bundle(repository / name))):
        episode.pop("action_dist_inputs")
    steps = len(episode["obs"])
    env = {"RLSERVE_REPOSITORY": str(repository), "RLSERVE_SESSION_STORE": redis_server.url,
           "RLSERVE_EXPORT_CACHE": str(tmp_path / "cache")}
    first = ServerProcess(env).start()
    try:
        with httpx.Client(base_url=first.url, timeout=60) as client:
            for t in range(steps // 2):
                _episode_step(client, name, "traced-episode", episode, t)
        first.kill()  # SIGKILL: no shutdown of any kind
    finally:
        first.stop()
    second = ServerProcess(env).start()
    try:
        with httpx.Client(base_url=second.url, timeout=60) as client:
            for t in range(steps // 2, steps):
                _episode_step(client, name, "traced-episode", episode, t)
    finally:
        second.stop()


def _masking_pairs() -> list[tuple[str, str]]:
    return [(c, m) for c, m in _pairs() if "action_mask" in (load_case(c).reference["modules"][m]
                                                               ["observation_space"].get("keys") or [])]


@pytest.mark.parametrize(("case_id", "module_id"), _masking_pairs() or [("<none>", "")])
def test_the_observations_mask_and_the_requests_mask_both_hold(
        server: httpx.Client, repository: Path, case_id: str, module_id: str) -> None:
    _require(case_id, "action-masking")
    manifest = load_bundle(repository / _name(case_id, module_id)).manifest
    assert manifest.connectors.get("observation_mask_key") == "action_mask"  # found by the export's probe
    name = _name(case_id, module_id)
    obs = load_case(case_id).observations(agent_of(load_case(case_id), module_id))[0]
    width = len(obs["action_mask"])
    rng = np.random.default_rng(3)
    own = (rng.random(width) < 0.3).astype(int)
    own[:3] = 1
    request = np.zeros(width, int)
    request[[1, 2, 5]] = 1  # with the observation's: only 1 and 2 (and 5 where it allows)
    allowed = set(np.flatnonzero(own & request).tolist())
    body = {"observations": [{**obs, "action_mask": own.tolist()}] * 64, "action_masks": [request.tolist()] * 64,
            "explore": True}
    taken = set(_act(server, name, body)["actions"])
    assert taken <= allowed and len(taken) > 1, (taken, allowed)
    only_obs = _act(server, name, {"observations": [{**obs, "action_mask": own.tolist()}] * 64, "explore": True})
    assert set(only_obs["actions"]) <= set(np.flatnonzero(own).tolist())
    nothing = _act(server, name, {"observation": {**obs, "action_mask": [0] * width}}, status=422)
    assert "action_mask" in str(nothing["error"]) and len(str(nothing)) < 2000


def _multi_agent_cases() -> list[str]:
    return [c for c in case_ids("custom") if load_case(c).multi_agent and not _explores_otherwise(c)]


@pytest.mark.parametrize("case_id", _multi_agent_cases() or ["<none>"])
def test_a_multi_agent_checkpoint_of_custom_modules_exports_as_a_policy_set(case_id: str, tmp_path: Path) -> None:
    """Every agent of RLlib's recorded rows answers as RLlib did through one agents/act request,
    the members (reaching a shared encoder through their MultiRLModule) traced into one set,
    the mapping given as data."""
    _require(case_id, "multi-agent")
    case = load_case(case_id)
    fixed = case.reference["fixed"]
    agents = {k.removeprefix("agent_"): v["module_id"] for k, v in fixed.items() if k.startswith("agent_")}
    repo = tmp_path / "repository"
    argv = [*rlserve_in_ray_env(), "export", str(case.checkpoint), "--trust-code", "--out", str(repo / "team"),
            "--quiet", *(a for agent, module in agents.items() for a in ("--map", f"{agent}={module}"))]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in (repo / "team" / "policies").iterdir()) == sorted(set(agents.values()))
    with running_server(["--policy-set", str(repo / "team")]) as url, \
            httpx.Client(base_url=url, timeout=60) as client:
        for i, row in enumerate(fixed["obs"][:25]):
            body = {"explore": False, "outputs": ["dist_inputs"],
                    "agents": {agent: {"observation": row[agent]} for agent in agents}}
            response = client.post("/v1/models/team/agents/act", json=body)
            assert response.status_code == 200, response.text
            for agent, answer in response.json()["agents"].items():
                recorded = case.fixed(agent)
                where = f"{case_id} row {i} agent {agent}"
                assert_close(answer["dist_inputs"], recorded["action_dist_inputs"][i], f"{where}: dist inputs")
                assert json_leaves(answer["action"]) == json_leaves(json_row(recorded, "action", i)), where


def test_the_cases_folder_is_found() -> None:
    assert Path(custom_modules_dir()).is_dir() and _pairs(), f"no custom-module cases in {custom_modules_dir()}"
    assert case_ids("custom")
