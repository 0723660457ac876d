"""Old-stack checkpoints whose ModelV2 class is the user's, exported with ``--trust-code``.

The cases in tests/fixtures/checkpoints-custom (recorded with RLlib 2.60 by
``scripts/record_rllib_checkpoint.py --custom-model``; their classes in
``custom_models_src/``, registered with RLlib's ``ModelCatalog`` by
``register_my_models.py`` there, which ``--import`` names) are exported in an environment
with RLlib (``tests/ray_venv.py``) and served over HTTP from this one, which has no ray:

- without the flag the export is refused in one line naming the registered model;
- every recorded observation from the initial state: the deterministic action, dist
  inputs, value and logp equal RLlib's;
- a recurrent model's recorded episode in a server-side session: every step's dist inputs
  and value, the state carried by the server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from newstack_cases import assert_close
from server_process import running_server
from traced_exports import rlserve_in_ray_env

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CASES = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints-custom"
SOURCES = CASES / "custom_models_src"


def _cases() -> list[str]:
    return sorted(p.name for p in CASES.iterdir() if (p / "reference.json").is_file()) if CASES.is_dir() else []


def _reference(case: str) -> dict[str, Any]:
    return json.loads((CASES / case / "reference.json").read_text())


def _export(case: str, out: Path, *flags: str, ray: bool = True) -> subprocess.CompletedProcess:
    command = rlserve_in_ray_env() if ray else [sys.executable, "-m", "rlserve.service.cli"]
    return subprocess.run([*command, "export", str(CASES / case / "checkpoint"), "--out", str(out), "--quiet",
                           *flags], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(SOURCES)})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    assert _cases(), f"no custom ModelV2 cases in {CASES}"
    repo = tmp_path_factory.mktemp("modelv2-repository")
    for case in _cases():
        done = _export(case, repo / case, "--trust-code", "--import", "register_my_models")
        assert done.returncode == 0, done.stderr[-3000:]
    with running_server(["--repository", str(repo)]) as url, httpx.Client(base_url=url, timeout=120) as client:
        yield client


@pytest.mark.parametrize("case", _cases() or ["<none>"])
def test_without_the_flag_the_users_model_is_refused_saying_what_to_run(case: str, tmp_path: Path) -> None:
    done = _export(case, tmp_path / "out", ray=False)
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("rlserve export:")]
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert repr(_reference(case)["custom_model"]["registered_name"]) in lines[0] and "--trust-code" in lines[0]


def _act(client: httpx.Client, name: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(f"/v1/models/{name}/act", json=body)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("case", _cases() or ["<none>"])
def test_recorded_observations_over_http(server: httpx.Client, case: str) -> None:
    fixed = _reference(case)["fixed"]
    got = _act(server, case, {"observations": fixed["obs"], "explore": False, "outputs": ["dist_inputs", "value"]})
    for i in range(len(fixed["obs"])):
        where = f"{case} fixed[{i}]"
        assert got["actions"][i] == fixed["action"][i], where
        assert_close(got["dist_inputs"][i], fixed["dist_inputs"][i], f"{where}: dist inputs")
        assert_close(got["value"][i], fixed["value"][i], f"{where}: value")
        assert_close(got["logp"][i], fixed["logp"][i], f"{where}: logp")


@pytest.mark.parametrize("case", [c for c in _cases() if _reference(c).get("recurrent")] or ["<none>"])
def test_a_recurrent_users_model_plays_rllibs_episode_in_a_session(server: httpx.Client, case: str) -> None:
    assert case != "<none>", f"no recurrent custom ModelV2 case in {CASES}"
    episode = _reference(case)["episode"]
    for t, obs in enumerate(episode["obs"]):
        body = {"observation": obs, "session_id": f"episode-{case}", "explore": False,
                "outputs": ["dist_inputs", "value"], **({"episode_start": True} if t == 0 else {})}
        got = _act(server, case, body)
        assert_close(got["dist_inputs"], episode["dist_inputs"][t], f"{case} step {t}: dist inputs")
        assert_close(got["value"], episode["value"][t], f"{case} step {t}: value")
        assert np.isfinite(got["logp"])
