"""Each way to start `rlserve serve` wrongly is refused with exit status 2 and one line on
stderr naming the variable or flag, what was expected and what was received: no
traceback, no third-party text or web address. Run through the installed `rlserve`
entry point, as a user runs it.

A missing extra is simulated with a ``sitecustomize`` that makes the named packages
unimportable in the server's interpreter (as if they were not installed).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest
from plain_http import HTTP
from server_process import REPO, free_port, rlserve_command, running_server

from rlserve.service.serving import export_cache

pytestmark = pytest.mark.e2e

CHECKPOINT = REPO / "tests" / "fixtures" / "checkpoints" / "ppo_cartpole_msgpack" / "checkpoint"
CARTPOLE_BUNDLE = REPO / "service" / "default_models" / "cartpole"
HIDE = textwrap.dedent("""
    import importlib.abc, os, sys

    _HIDDEN = set(os.environ.get("HIDE_MODULES", "").split(","))

    class _NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in _HIDDEN:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _NotInstalled())
""")


def _env(tmp_path: Path, hide: str = "", **variables: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("RLSERVE_")}
    paths = [str(REPO)]
    if hide:
        site = tmp_path / "hide"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(HIDE)
        paths.insert(0, str(site))
        env["HIDE_MODULES"] = hide
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    env["RLSERVE_EXPORT_CACHE"] = str(tmp_path / "cache")
    env["RLSERVE_PORT"] = str(free_port())  # should a refused start start after all, not on 8000
    env.update(variables)
    return env


def refused(args: list[str], env: dict[str, str]) -> str:
    """Start `rlserve serve ARGS`; it must exit 2 with one line; that line."""
    done = subprocess.run([*rlserve_command(), "serve", *args], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith("rlserve serve: "), line
    for foreign in ("Traceback", "http://", "https://", "pydantic", "errors.pydantic.dev"):
        assert foreign not in line, line
    return line


def test_a_bad_setting_value_names_the_variable(tmp_path: Path) -> None:
    line = refused([], _env(tmp_path, RLSERVE_PORT="abc"))
    assert line == "rlserve serve: RLSERVE_PORT: expected an integer, received 'abc'"


def test_a_bad_flag_value_names_the_flag(tmp_path: Path) -> None:
    line = refused(["--workers", "0"], _env(tmp_path))
    assert line == "rlserve serve: --workers: expected a number >= 1, received 0"
    assert "--port" in refused(["--port", "abc"], _env(tmp_path))  # argparse's own check, in one line


def test_a_checkpoint_list_that_is_not_json(tmp_path: Path) -> None:
    line = refused([], _env(tmp_path, RLSERVE_CHECKPOINTS="my-policy=/somewhere"))
    assert line.startswith("rlserve serve: RLSERVE_CHECKPOINTS: expected a JSON list"), line
    assert "received 'my-policy=/somewhere'" in line


@pytest.mark.parametrize("given", ["flag", "variable"])
def test_a_repository_that_does_not_exist_is_refused_either_way(tmp_path: Path, given: str) -> None:
    missing = tmp_path / "modles"
    if given == "flag":
        line = refused(["--repository", str(missing)], _env(tmp_path))
        name = "--repository"
    else:
        line = refused([], _env(tmp_path, RLSERVE_REPOSITORY=str(missing)))
        name = "RLSERVE_REPOSITORY"
    assert line == (f"rlserve serve: {name}: expected a directory of bundles, received {str(missing)!r} "
                    "(nothing is there)")


def test_a_checkpoint_that_does_not_exist(tmp_path: Path) -> None:
    line = refused(["--checkpoint", f"mine={tmp_path / 'nope'}"], _env(tmp_path))
    assert line.startswith("rlserve serve: --checkpoint mine=") and "expected an RLlib checkpoint directory" in line


def test_a_multi_policy_checkpoint_is_refused_with_what_serve_accepts(tmp_path: Path) -> None:
    """Not `--module-id`, which `serve` does not take: a policy set, or one policy's directory."""
    checkpoint = REPO / "tests" / "fixtures" / "checkpoints" / "ppo_rps_multiagent" / "checkpoint"
    line = refused(["--checkpoint", f"rps={checkpoint}"], _env(tmp_path))
    assert "holds 2 policies (p0, p1)" in line and f"--policy-set NAME={checkpoint}" in line, line
    assert "--module-id" not in line and "--policy-id" not in line


def test_a_folder_above_the_checkpoint_names_the_checkpoint_below(tmp_path: Path) -> None:
    """Not 'no manifest.json': the folder holds no checkpoint, the one below does."""
    line = refused(["--checkpoint", f"my-policy={CHECKPOINT.parent}"], _env(tmp_path))
    assert "no RLlib checkpoint is there" in line and repr(str(CHECKPOINT)) in line and "manifest" not in line, line


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_port_in_use_is_refused_before_anything_loads(tmp_path: Path, workers: str) -> None:
    """Not exit 3 after every model loaded: the port is bound first, so the one line is all
    that is printed (loading a model logs)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = refused(["--port", str(port), "--workers", workers, "--checkpoint", f"my-policy={CHECKPOINT}"],
                       _env(tmp_path))
    assert line == (f"rlserve serve: --port: expected a port no other program listens on at 127.0.0.1, received "
                    f"{port} (Address already in use: stop that program, or choose another port)")


def test_a_session_store_that_does_not_answer(tmp_path: Path) -> None:
    socket_path = tmp_path / "redis.sock"  # nothing listens there
    line = refused([], _env(tmp_path, RLSERVE_SESSION_STORE=f"unix://{socket_path}"))
    assert line.startswith(f"rlserve serve: RLSERVE_SESSION_STORE: expected a Redis or Valkey server answering at "
                           f"unix://{socket_path}, received ConnectionError"), line
    closed = free_port()
    line = refused(["--workers", "2"], _env(tmp_path, RLSERVE_SESSION_STORE=f"redis://127.0.0.1:{closed}/0"))
    assert f"redis://127.0.0.1:{closed}/0" in line and "ConnectionError" in line


def test_a_session_store_without_the_redis_extra(tmp_path: Path) -> None:
    line = refused([], _env(tmp_path, hide="redis", RLSERVE_SESSION_STORE="redis://127.0.0.1:6379/0"))
    assert line.startswith("rlserve serve: RLSERVE_SESSION_STORE: a session store needs the redis client library "
                           "(pip install 'rlserve[redis]')"), line


def test_grpc_without_its_extra(tmp_path: Path) -> None:
    line = refused(["--grpc-port", str(free_port())], _env(tmp_path, hide="grpc"))
    assert "--grpc-port" in line and "pip install 'rlserve[grpc]'" in line


def test_a_checkpoint_without_torch(tmp_path: Path) -> None:
    line = refused(["--checkpoint", f"my-policy={CHECKPOINT}"], _env(tmp_path, hide="torch,onnxscript"))
    assert line.startswith(f"rlserve serve: --checkpoint my-policy={CHECKPOINT}: serving an RLlib checkpoint "
                           "exports it, which needs the [torch] extra (pip install 'rlserve[torch]'); not installed: "
                           "torch, onnxscript."), line


def test_a_kept_export_is_served_without_torch(tmp_path: Path) -> None:
    """With the checkpoint's export in the cache, torch is not needed (nor imported)."""
    key = export_cache.export_key(CHECKPOINT, "my-policy", None)
    cache = tmp_path / "cache"
    cache.mkdir()
    shutil.copytree(CARTPOLE_BUNDLE, cache / key)  # stands in for the kept export of this checkpoint
    env = _env(tmp_path, hide="torch,onnxscript")  # RLSERVE_EXPORT_CACHE is tmp_path / "cache"
    with running_server(["--checkpoint", f"my-policy={CHECKPOINT}"], env=env) as url:
        assert [m["name"] for m in HTTP.get(f"{url}/v1/models").json()["models"]] == ["cartpole"]


def test_client_variables_from_the_docs_do_not_stop_the_server(tmp_path: Path) -> None:
    """docs/api.md's gRPC example has users export RLSERVE_GRPC_URL; the README RLSERVE_URL."""
    env = {"RLSERVE_GRPC_URL": "localhost:8001", "RLSERVE_URL": "http://localhost:8000"}
    with running_server(env=env) as url:
        assert HTTP.get(f"{url}/readyz").status_code == 200


def test_several_mistakes_are_one_line_each(tmp_path: Path) -> None:
    done = subprocess.run([*rlserve_command(), "serve", "--repository", str(tmp_path / "nope")],
                          env=_env(tmp_path, RLSERVE_PORT="80000", RLSERVE_RUNTIME="tensorrt"), cwd=REPO,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "rlserve serve: RLSERVE_PORT: expected a number <= 65535, received '80000'",
        "rlserve serve: RLSERVE_RUNTIME: expected one of auto, onnx or torchscript, received 'tensorrt'",
    ], done.stderr
