"""Real RLlib checkpoints served over HTTP answer as RLlib did.

Every case of ``checkpoint_cases`` (RLSERVE_CHECKPOINT_DIR plus tests/fixtures/checkpoints)
is exported as ``rlserve export CHECKPOINT --out`` does (its main, once per run for this and
conformance/test_checkpoints.py: ``checkpoint_cases.exported_checkpoint``) into one
repository, served by a real ``rlserve serve`` process, and asked over HTTP:

- the ~100 recorded observations, each from the initial state, deterministic: the model's
  action (``outputs: ["raw_action"]``) equals RLlib's, ``action`` equals what RLlib hands
  the environment (unsquashed when the policy normalises actions), and dist_inputs, value
  and logp match;
- recurrent cases: the recorded episode stepped in a server-side session, reporting
  RLlib's previous reward and the action RLlib actually took (its raw sample, routinely
  outside a Box's bounds) as ``prev_action``; every step's outputs match.

``rlserve serve --checkpoint`` (exported in the server process itself) is checked on one case.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from checkpoint_cases import (
    CheckpointCase,
    case_ids,
    checkpoint_dir,
    exported_checkpoint,
    load_checkpoint_case,
    model_name,
)
from server_process import ServerProcess, rlserve_command, running_server

pytestmark = pytest.mark.e2e

RTOL = ATOL = 1e-5


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    ids = case_ids()
    if not ids:
        pytest.fail(f"no checkpoint cases found: set RLSERVE_CHECKPOINT_DIR (looked in {checkpoint_dir()})")
    repo = tmp_path_factory.mktemp("repo")
    for case_id in ids:  # rlserve export's main, once per run (conformance/test_checkpoints.py checks the same)
        case = load_checkpoint_case(case_id)
        shutil.copytree(exported_checkpoint(tmp_path_factory, case), repo / model_name(case))
    with running_server(["--repository", str(repo)]) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield client


def _close(actual: Any, expected: Any, what: str) -> None:
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64),
                               rtol=RTOL, atol=ATOL, err_msg=what)


def _act(client: httpx.Client, case: CheckpointCase, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(f"/v1/models/{model_name(case)}/act", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def _env_action(case: CheckpointCase, ref: dict[str, Any], i: int) -> Any:
    unsquashed = ref.get("action_unsquashed")
    if case.reference.get("normalize_actions") and unsquashed:
        return unsquashed[i]
    return ref["action"][i]


def _same(actual: Any, expected: Any, what: str) -> None:
    if np.issubdtype(np.asarray(expected).dtype, np.integer):
        assert actual == expected, f"{what}: {actual} != {expected}"
    else:
        _close(actual, expected, what)


@pytest.mark.parametrize("case_id", case_ids() or ["<none>"])
def test_fixed_observations_over_http(server: httpx.Client, case_id: str) -> None:
    case = load_checkpoint_case(case_id)
    fixed = case.reference["fixed"]
    got = _act(server, case, {"observations": fixed["obs"], "explore": False,
                              "outputs": ["raw_action", "value", "dist_inputs"]})
    for i in range(len(fixed["obs"])):
        where = f"{case_id} fixed[{i}]"
        _same(_flat(got["raw_action"][i]), _flat(fixed["action"][i]), f"{where}: model action")
        _same(_flat(got["actions"][i]), _flat(_env_action(case, fixed, i)), f"{where}: env action")
    _close(got["dist_inputs"], fixed["dist_inputs"], f"{case_id}: dist_inputs")
    _close(got["value"], fixed["value"], f"{case_id}: value")
    _close(got["logp"], fixed["logp"], f"{case_id}: logp of the deterministic action")


def _recurrent_ids() -> list[str]:
    return [i for i in case_ids() if load_checkpoint_case(i).recurrent]


@pytest.mark.parametrize("case_id", _recurrent_ids())
def test_recurrent_episode_over_http_with_raw_previous_actions(server: httpx.Client, case_id: str) -> None:
    case = load_checkpoint_case(case_id)
    episode = case.reference["episode"]
    session = f"replay-{model_name(case)}"
    for t, obs in enumerate(episode["obs"]):
        body: dict[str, Any] = {"observation": obs, "session_id": session, "explore": False,
                                "outputs": ["raw_action", "value", "dist_inputs"]}
        if t == 0:
            body["episode_start"] = True
        else:
            body["prev_action"] = episode["taken_action"][t - 1]  # RLlib's raw sample, unclipped
            body["reward"] = episode["reward"][t - 1]
        got = _act(server, case, body)
        where = f"{case_id} step {t}"
        _same(_flat(got["raw_action"]), _flat(episode["action"][t]), f"{where}: model action")
        _same(_flat(got["action"]), _flat(_env_action(case, episode, t)), f"{where}: env action")
        _close(got["dist_inputs"], episode["dist_inputs"][t], f"{where}: dist_inputs")
        _close(got["value"], episode["value"][t], f"{where}: value")
        _close(got["logp"], episode["logp"][t], f"{where}: logp")


def _flat(value: Any) -> Any:
    """A JSON action as a flat list (Dict/Tuple leaves in order), or a scalar as itself."""
    if isinstance(value, dict):
        return [x for k in sorted(value) for x in np.ravel(_flat(value[k])).tolist()]
    if isinstance(value, list):
        return np.ravel(np.asarray([_flat(v) for v in value], dtype=object).tolist()).tolist()
    return value


def test_serve_checkpoint_in_one_command(tmp_path: Path) -> None:
    """`rlserve serve --checkpoint NAME=DIR` exports in the server and serves RLlib's answers.
    Its export cache is its own: not the user's, where an earlier run would have left the export."""
    case_id = (_recurrent_ids() or case_ids())[0]
    case = load_checkpoint_case(case_id)
    fixed = case.reference["fixed"]
    env = {"RLSERVE_EXPORT_CACHE": str(tmp_path / "cache")}
    with running_server(["--checkpoint", f"mine={case.checkpoint}"], env=env) as url, \
            httpx.Client(base_url=url) as client:
        assert [m["name"] for m in client.get("/v1/models").json()["models"]] == ["mine"]
        got = client.post("/v1/models/mine/act", json={"observations": fixed["obs"][:10], "explore": False,
                                                        "outputs": ["raw_action", "value"]}).json()
    for i in range(10):
        _same(_flat(got["raw_action"][i]), _flat(fixed["action"][i]), f"{case_id} fixed[{i}]: model action")
    _close(got["value"], fixed["value"][:10], f"{case_id}: value")
    assert len([p for p in (tmp_path / "cache").iterdir() if p.is_dir()]) == 1  # exported now, kept for the next start


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["one-process", "two-workers"])
def test_a_checkpoint_that_does_not_load_stops_the_start(tmp_path: Path, workers: list[str]) -> None:
    """Exit status 2 and the reason in one line, whether one process serves or a supervisor
    runs workers (which must not restart them forever): for a directory that is no
    checkpoint and for a path with nothing there (both found before anything loads; the first
    says that no checkpoint is there, nor in a folder below it)."""
    not_a_checkpoint = tmp_path / "empty-folder"
    not_a_checkpoint.mkdir()
    for path, says in ((not_a_checkpoint, "no RLlib checkpoint is there"),
                       (tmp_path / "no-such-checkpoint", "nothing is there")):
        proc = subprocess.run([*rlserve_command(), "serve", "--port", "0", *workers, "--checkpoint", f"mine={path}"],
                              capture_output=True, text=True, timeout=120,
                              env={k: v for k, v in os.environ.items() if not k.startswith("RLSERVE_")})
        assert proc.returncode == 2, proc.stderr
        (line,) = [line for line in proc.stderr.splitlines() if line.startswith("rlserve serve: ")]
        assert line.startswith(f"rlserve serve: --checkpoint mine={path}: ") and says in line, proc.stderr
        assert "Traceback" not in proc.stderr


def test_workers_export_a_checkpoint_once(tmp_path: Path) -> None:
    """`--workers 2 --checkpoint`: one export (into the export cache), both workers serve it."""
    case = load_checkpoint_case(case_ids()[0])
    server = ServerProcess({"RLSERVE_EXPORT_CACHE": str(tmp_path / "cache"), "RLSERVE_LOG_LEVEL": "info"},
                           args=["--workers", "2", "--checkpoint", f"mine={case.checkpoint}"])
    try:
        server.start()
        with httpx.Client(base_url=server.url) as client:
            answers = [client.post("/v1/models/mine/act", json={"observation": case.reference["fixed"]["obs"][0]})
                       for _ in range(8)]
        assert server.log is not None
        fd = server.log.fileno()
        log = os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")  # all of it, not the tail
    finally:
        server.stop()
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert log.count("exporting the RLlib checkpoint") == 1, log
