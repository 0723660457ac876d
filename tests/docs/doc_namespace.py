"""Run a command in new network and PID namespaces: its own loopback, nothing outside.

Why a namespace rather than moving the documented port: the docs' commands then run as
written, ``127.0.0.1:8000`` and Redis's ``6379`` included, however many test runs share the
machine, and no text of a block is rewritten before it runs. The network namespace has only
a loopback interface (no route out), and the PID namespace ends every process the page
started (servers, ``redis-server &``) when its runner exits.

As root ``unshare --net --pid`` needs nothing more; otherwise a user namespace maps the
caller to root inside (``--map-root-user``), which needs unprivileged user namespaces. A
machine that allows neither fails the tests that need this, with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path


def namespace_prefix() -> list[str]:
    unshare = shutil.which("unshare")
    if unshare is None:
        raise RuntimeError("unshare (util-linux) is not installed: the doc runner needs it for a private network")
    prefix = [unshare, "--net", "--pid", "--fork", "--mount-proc", "--kill-child"]
    if os.geteuid() != 0:
        prefix.insert(1, "--map-root-user")
        prefix.insert(1, "--user")
    return prefix


def run_isolated(command: Sequence[str], timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``command`` inside fresh network and PID namespaces; fails loudly if they cannot be made."""
    done = subprocess.run([*namespace_prefix(), *command], capture_output=True, text=True, timeout=timeout, cwd=cwd)
    if done.returncode != 0 and "unshare" in done.stderr and "Operation not permitted" in done.stderr:
        raise RuntimeError(f"cannot create network/PID namespaces here: {done.stderr.strip()}")
    return done
