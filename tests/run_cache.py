"""Work a test run does once for all its pytest-xdist workers.

``shared_folder(tmp_path_factory, "exports/NAME", build)`` is a folder that ``build(path)``
makes (it creates ``path``) the first time any worker of the run asks for it; a worker that
asks meanwhile waits for it (a file lock per folder), later ones find it. The folders live
beside the workers' own temporary folders (their parent, which is the run's), so each run
builds afresh and nothing leaks between runs. Read only: copy a folder to change it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any


def shared_folder(tmp_path_factory: Any, name: str, build: Callable[[Path], object]) -> Path:
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "run-cache"
    done = root / name
    done.parent.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name.replace('/', '~')}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_dir():
            partial = done.parent / f".{done.name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            build(partial)
            partial.rename(done)
    return done
