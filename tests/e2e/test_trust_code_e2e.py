"""``rlserve export --trust-code``: what it refuses, in one line, and what it serves exactly.

Without the flag (or without ray) a custom module is refused in one line that names its class
and says what to run, and a checkpoint whose pickle would run a command stays refused (the
restricted reader never runs it). In an RLlib environment (``tests/ray_venv.py``), user
module classes saved by ``tests/fixtures/traced_modules/save_modules.py``:

- Python control flow on a tensor's value is refused naming the file, line and function;
- a distribution class whose numbers no rlserve distribution computes is refused naming it;
- a stateful module whose initial state is not zeros (kept by the session as an offset) and
  has a value function plays RLlib's recorded steps over HTTP, four sessions at once.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from newstack_cases import assert_close, custom_modules_dir, load_case, module_pairs
from ray_venv import ray_python
from server_process import running_server
from traced_exports import rlserve_in_ray_env

from rlserve.models.newstack.layout import RL_MODULE_DIR

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TESTS = Path(__file__).resolve().parents[1]
USER_MODULES = TESTS / "fixtures" / "traced_modules"


def _a_custom_case():
    pairs = module_pairs("custom")
    if not pairs:
        pytest.fail(f"no custom-module cases found in {custom_modules_dir()}")
    return load_case(pairs[0][0])


def _export(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=cwd,
                          env={**os.environ, **(env or {})})


def _refusal(done: subprocess.CompletedProcess) -> str:
    """The one line of a refusal (exit 2); RLlib's own logging before it aside."""
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("rlserve export:")]
    assert len(lines) == 1, done.stderr[-2000:]
    return lines[0]


def test_without_the_flag_a_custom_module_is_refused_saying_what_to_run(tmp_path: Path) -> None:
    case = _a_custom_case()
    done = _export([sys.executable, "-m", "rlserve.service.cli", "export", str(case.checkpoint), "--out",
                    str(tmp_path / "out")], tmp_path)
    line = _refusal(done)
    module_class = case.reference["modules"][case.module_ids[0]]["env_runner_module_class"]
    assert module_class in line and "--trust-code" in line
    assert not (tmp_path / "out").exists()


def test_the_flag_without_ray_says_what_to_install(tmp_path: Path) -> None:
    case = _a_custom_case()
    done = _export([sys.executable, "-m", "rlserve.service.cli", "export", str(case.checkpoint), "--trust-code",
                    "--out", str(tmp_path / "out")], tmp_path)
    line = _refusal(done)
    assert "ray[rllib]==2.60.0" in line and "ray cannot be imported" in line


class _RunsACommand:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_would_run_a_command_is_refused_without_the_flag(tmp_path: Path) -> None:
    case = _a_custom_case()
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(case.checkpoint, checkpoint)
    marker = tmp_path / "ran"
    module = checkpoint / RL_MODULE_DIR / case.module_ids[0] / "class_and_ctor_args.pkl"
    module.write_bytes(pickle.dumps({"class": _RunsACommand(marker), "ctor_args_and_kwargs": ((), {})}))
    done = _export([sys.executable, "-m", "rlserve.service.cli", "export", str(checkpoint), "--out",
                    str(tmp_path / "out")], tmp_path)
    line = _refusal(done)
    assert "system" in line and not marker.exists()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("user-modules")
    done = _export([str(ray_python()), str(USER_MODULES / "save_modules.py"), str(out)], out,
                   {"PYTHONPATH": str(USER_MODULES)})
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _trace(saved: Path, name: str, out: Path) -> subprocess.CompletedProcess:
    return _export([*rlserve_in_ray_env(), "export", str(saved / name), "--trust-code", "--out", str(out),
                    "--quiet"], out.parent, {"PYTHONPATH": str(USER_MODULES)})


def test_control_flow_on_a_tensors_value_is_refused_naming_the_line(saved: Path, tmp_path: Path) -> None:
    line = _refusal(_trace(saved, "BranchOnValue", tmp_path / "out"))
    assert "user_modules.BranchOnValue cannot be traced at user_modules.py:" in line
    assert "in _forward (if obs.sum() > 0:" in line
    assert not (tmp_path / "out").exists()


def test_a_distribution_rlserve_cannot_compute_is_refused_naming_it(saved: Path, tmp_path: Path) -> None:
    line = _refusal(_trace(saved, "StrangeDistModule", tmp_path / "out"))
    assert "user_modules.SquaredLogpCategorical" in line and "cannot serve it exactly" in line


def test_a_state_that_does_not_start_at_zero_steps_as_rllib_over_http(saved: Path, tmp_path: Path) -> None:
    out = tmp_path / "repository" / "gru"
    out.parent.mkdir()
    done = _trace(saved, "TwoStateGRU", out)
    assert done.returncode == 0, done.stderr[-3000:]
    reference = np.load(saved / "TwoStateGRU.npz")
    steps, rows = reference["obs"].shape[:2]
    with running_server(["--repository", str(out.parent)]) as url, httpx.Client(base_url=url, timeout=60) as client:
        for t in range(steps):
            for r in range(rows):
                body = {"observation": reference["obs"][t, r].tolist(), "session_id": f"s{r}", "explore": False,
                        "outputs": ["dist_inputs", "value"], **({"episode_start": True} if t == 0 else {})}
                response = client.post("/v1/models/gru/act", json=body)
                assert response.status_code == 200, response.text
                got = response.json()
                assert_close(got["dist_inputs"], reference["dist_inputs"][t, r], f"step {t} row {r}: dist inputs")
                assert_close(got["value"], reference["value"][t, r], f"step {t} row {r}: value")


def _documented_ray_block() -> list[str]:
    text = (TESTS.parent / "docs" / "newstack.md").read_text()
    start = text.index("<!-- not-run: ray -->\n```bash\n") + len("<!-- not-run: ray -->\n```bash\n")
    return text[start:text.index("```", start)].strip().splitlines()


def test_the_documented_trust_code_commands_are_what_the_tests_run(tmp_path: Path) -> None:
    """docs/newstack.md's environment is the one tests/ray_venv.py makes, and its export line,
    run in it on a real custom-module checkpoint, writes what the page's example shows."""
    from ray_venv import RLLIB

    make, export = _documented_ray_block()
    assert all(f'"{requirement}"' in make for requirement in RLLIB) and '-e ".[torch]"' in make
    assert export.startswith("ray-venv/bin/rlserve export $CUSTOM_CHECKPOINT --trust-code --out ")
    case = next(load_case(c) for c, _ in module_pairs("custom")
                if "action_mask" in (load_case(c).reference["modules"][_]["observation_space"].get("keys") or []))
    argv = [*rlserve_in_ray_env(), *export.split()[1:]]
    argv[argv.index("$CUSTOM_CHECKPOINT")] = str(case.checkpoint)
    done = _export(argv, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    fixture = TESTS / "fixtures" / "traced" / "action-masking"
    shown = [subprocess.run([sys.executable, "-m", "rlserve.service.cli", "inspect", str(path)], capture_output=True,
                            text=True, timeout=120).stdout for path in (tmp_path / export.split()[-1], fixture)]
    lines = [[ln for ln in out.splitlines() if ln.startswith(("stack", "  the module", "action distribution"))]
             for out in shown]
    assert lines[0] == lines[1] and len(lines[0]) == 4, lines
