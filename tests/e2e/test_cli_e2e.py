"""The `rlserve` entry point itself: --version, and unknown commands answered with the closest."""

from __future__ import annotations

import subprocess
from importlib import metadata

import pytest
from server_process import rlserve_command

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
