"""The `rlserve` entry point itself: --version, unknown commands answered with the closest, and
a command whose extra is not installed."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from server_process import REPO, rlserve_command

pytestmark = pytest.mark.e2e


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*rlserve_command(), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(flag: str) -> None:
    done = _run(flag)
    assert done.returncode == 0 and done.stdout == f"rlserve {metadata.version('rlserve')}\n", done


@pytest.mark.parametrize(("typed", "meant"), [("server", "serve"), ("exprt", "export"), ("inpsect", "inspect"),
                                              ("demos", "demo")])
def test_an_unknown_command_suggests_the_closest(typed: str, meant: str) -> None:
    done = _run(typed)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (f"rlserve: unknown command {typed!r}: did you mean `rlserve {meant}`? "
                           "(`rlserve --help` lists them)\n")


def test_an_unknown_command_far_from_any_lists_them() -> None:
    done = _run("train")
    assert done.returncode == 2
    assert done.stderr.strip() == ("rlserve: unknown command 'train': the commands are serve, export, inspect, demo, "
                                   "experience (`rlserve --help` lists them)")


def test_help_mentions_version() -> None:
    done = _run("--help")
    assert done.returncode == 0 and "rlserve --version" in done.stdout


# `rlserve` in an interpreter where torch cannot be imported (as if not installed).
WITHOUT_TORCH = ("import sys; sys.modules['torch'] = None; from rlserve.service.cli import main; "
                 "sys.exit(main(sys.argv[1:]))")


@pytest.mark.parametrize("source", [
    ["tests/fixtures/checkpoints/ppo_cartpole_msgpack/checkpoint"],
    ["tests/fixtures/checkpoints/ppo_rps_multiagent/checkpoint", "--map", "player_0=p0", "--map", "player_1=p1"],
])
def test_export_without_torch_names_the_extra(source: list[str], tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", WITHOUT_TORCH, "export", *source, "--out", str(tmp_path / "b")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    assert done.stderr == ("rlserve export: error: exporting needs the [torch] extra (pip install "
                           "'rlserve[torch]'); not installed: torch\n"), done.stderr
    assert not (tmp_path / "b").exists()
