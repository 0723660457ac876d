"""Every command in the README runs as written (only the port is moved to a free one).

The README's fenced ``bash`` blocks are parsed line by line and every line must be claimed
by one of the runners below; a new command that no test runs fails ``test_every_command_is_claimed``.
`docker` lines are run by the container check (scripts/container_check.sh), not here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from server_process import REPO, rlserve_command, running_server

pytestmark = pytest.mark.e2e

README = REPO / "README.md"
DEFAULT_PORT = "127.0.0.1:8000"
TOKEN = "change-me"
# A real RLlib checkpoint of a CartPole policy, for the README's `$CHECKPOINT` lines, and a
# new-API-stack one (an LSTM reading previous actions and rewards) for `$RLMODULE_CHECKPOINT`.
CHECKPOINT = REPO / "tests" / "fixtures" / "checkpoints" / "ppo_cartpole_msgpack" / "checkpoint"
RLMODULE_CHECKPOINT = REPO / "tests" / "fixtures" / "newstack" / "ppo_lstm_prev2" / "checkpoint"


def readme_blocks() -> list[list[str]]:
    text = README.read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [[line.strip() for line in b.splitlines() if line.strip() and not line.startswith("#")] for b in blocks]


def readme_lines() -> list[str]:
    return [line for block in readme_blocks() for line in block]


def _kind(line: str) -> str:
    if line.startswith("docker "):
        return "container"
    if line.startswith("curl ") and "/v1/admin/" in line:
        return "admin-curl"
    if line.startswith("curl "):
        return "tour-curl"
    if line.startswith("export RLSERVE_ADMIN_TOKEN="):
        return "admin-env"
    if line.startswith(("rlserve export ", "rlserve inspect ")):
        return "export"
    if line == "rlserve demo":
        return "demo"
    if line.startswith("python scripts/"):
        return "script"
    if line.startswith("rlserve serve --checkpoint "):
        return "checkpoint-serve"
    if "rlserve serve" in line:
        return "serve"
    if line.startswith(("pip install", "python -m pip install")):
        return "install"
    return "unclaimed"


def _run(line: str, port: int, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    command = line.replace(DEFAULT_PORT, f"127.0.0.1:{port}")
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RLSERVE_")}
    # `python` in a README line is the interpreter running the tests (its environment has
    # the project installed), whether or not that environment was activated.
    full_env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + full_env.get("PATH", "")
    full_env["RLSERVE_PORT"] = str(port)
    full_env.update(env or {})
    if command.startswith("rlserve "):
        command = shlex.join(rlserve_command()) + command[len("rlserve"):]
    proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"{line!r} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return proc.stdout


def _json_ok(line: str, out: str) -> dict:
    body = json.loads(out)
    assert "error" not in body, f"{line!r} answered an error: {body}"
    return body


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_every_command_is_claimed():
    unclaimed = [line for line in readme_lines() if _kind(line) == "unclaimed"]
    assert not unclaimed, f"README commands no test runs: {unclaimed}"


def test_quick_start_commands():
    blocks = readme_blocks()
    assert blocks[0] == ["pip install . && rlserve serve"]
    ci = (REPO / ".ci" / "run").read_text()
    install, test = blocks[1][0].split(" && ")
    assert install in ci and test in ci, "the README's test command must be what .ci/run runs"


def test_tour_against_the_default_server(tmp_path):
    """`rlserve serve` with no arguments, then the tour's curl lines and `rlserve demo`."""
    with running_server() as url:
        port = _port(url)
        tour = [line for line in readme_lines() if _kind(line) == "tour-curl"]
        assert len(tour) >= 5
        for line in tour:
            out = _run(line, port, tmp_path)
            if "-X DELETE" not in line and "/sessions" in line and "-d" in line:
                assert _json_ok(line, out)["session_id"] == "episode-1"
            elif "/act" in line:
                body = _json_ok(line, out)
                assert body["action"] in (0, 1) and body["logp"] <= 0.0
                if "action_mask" in line:
                    assert body["action"] == 1
        demo = _run("rlserve demo", port, tmp_path)
        assert "cartpole on CartPole-v1" in demo and "cartpole-memory" in demo


def _export_inputs(workdir: Path) -> None:
    """The files the README's export line names, from the shipped cartpole training output."""
    policy = REPO / "scripts" / "training" / "policies" / "cartpole"
    spec = json.loads((policy / "spec.json").read_text())
    (workdir / "obs_space.json").write_text(json.dumps(spec["observation_space"]))
    (workdir / "action_space.json").write_text(json.dumps(spec["action_space"]))
    (workdir / "model.json").write_text(json.dumps(spec["model_config"]))
    shutil.copy(policy / "weights.npz", workdir / "weights.npz")


def test_export_and_admin_commands(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    serve_line = next(line for line in readme_lines() if _kind(line) == "serve" and "--repository" in line)
    assert serve_line.startswith(f"RLSERVE_ADMIN_TOKEN={TOKEN} rlserve serve ")
    args = shlex.split(serve_line)[3:]
    with running_server(args, env={"RLSERVE_ADMIN_TOKEN": TOKEN}, cwd=repo, ready_path="/healthz") as url:
        port = _port(url)
        _export_inputs(repo)
        for line in [line for line in readme_lines() if _kind(line) == "export"]:
            out = _run(line, port, repo, {"CHECKPOINT": str(CHECKPOINT),
                                          "RLMODULE_CHECKPOINT": str(RLMODULE_CHECKPOINT)})
            if line.startswith("rlserve inspect"):
                assert "Discrete" in out and "sha256" in out.lower()
        assert (repo / "my-policy" / "manifest.json").is_file() and (repo / "my-policy.rlsb").is_file()
        assert json.loads((repo / "my-policy" / "manifest.json").read_text())["source"], "not from the checkpoint"
        module_source = json.loads((repo / "my-module" / "manifest.json").read_text())["source"]
        assert module_source["stack"] == "new" and module_source["module_id"] == "default_policy"
        assert (repo / "my-npz-policy" / "manifest.json").is_file()

        token_line = next(line for line in readme_lines() if _kind(line) == "admin-env")
        env = {"RLSERVE_ADMIN_TOKEN": token_line.split("=", 1)[1]}
        answers = [
            _json_ok(line, _run(line, port, repo, env)) for line in readme_lines() if _kind(line) == "admin-curl"
        ]
        listed, loaded, unloaded, uploaded = answers
        assert "models" in listed
        assert loaded["name"] == "my-policy" and loaded["current"] is True
        assert unloaded["name"] == "my-policy"
        assert uploaded["name"] == "my-policy"
        act = _run(f"curl -s -X POST {DEFAULT_PORT}/v1/models/my-policy/act -d '{{\"observation\": [0, 0, 0, 0]}}'",
                   port, repo)
        assert _json_ok("act on my-policy", act)["action"] in (0, 1)


def test_serve_a_checkpoint_in_one_command(tmp_path):
    (line,) = [line for line in readme_lines() if _kind(line) == "checkpoint-serve"]
    args = shlex.split(line.replace("$CHECKPOINT", str(CHECKPOINT)))[2:]
    with running_server(args, cwd=tmp_path) as url:
        act = _run(f"curl -s -X POST {DEFAULT_PORT}/v1/models/my-policy/act -d '{{\"observation\": [0, 0, 0, 0]}}'",
                   _port(url), tmp_path)
        assert _json_ok("act on my-policy", act)["action"] in (0, 1)


@pytest.mark.parametrize("line", [line for line in readme_lines() if _kind(line) == "script"])
def test_scripts(line, tmp_path):
    out = _run(line, 0, REPO, timeout=600)
    if "bench_server" in line:
        assert "req/s" in out
    else:
        assert "cartpole" in out
