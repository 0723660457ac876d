"""A virtual environment with RLlib, for the tests that trace custom modules.

rlserve's runtime never imports ray; ``rlserve export --trust-code`` needs it, in the
user's training environment. The tests make such an environment once and run the real
command line in it:

    ray_python() -> Path   an interpreter with ray[rllib]==2.60.0, torch==2.13.0 and this
                           checkout (rlserve[torch], editable)

``RLSERVE_RAY_PYTHON`` names an interpreter to use as it is. Otherwise the environment lives
in ``RLSERVE_RAY_VENV`` (default ``~/.cache/rlserve-tests/ray-2.60.0-py<X.Y>``), made under
a file lock (two xdist workers, or ``.ci/run`` starting it early in the background) and
reused while its stamp holds; a stamp made for another checkout only reinstalls rlserve.
Run as a script, it makes the environment and says where (``.ci/run`` starts
``tests/ray_venv.py --rllib-only`` first, in the background).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RLLIB = ("ray[rllib]==2.60.0", "torch==2.13.0")
_TAG = f"ray-2.60.0-py{sys.version_info.major}.{sys.version_info.minor}"


def _venv_dir() -> Path:
    env = os.environ.get("RLSERVE_RAY_VENV")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rlserve-tests" / _TAG


def _stamp() -> str:
    digest = hashlib.sha256((REPO_ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    return f"{' '.join(RLLIB)}\n{REPO_ROOT}\n{digest}\n"


def _pip(python: Path, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_USER")}
    env.update(PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", *args], env=env, capture_output=True,
                          text=True, timeout=1800)
    if done.returncode:
        raise RuntimeError(f"making the RLlib environment failed: pip install {' '.join(args)}:\n"
                           f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def ray_python(*, rllib_only: bool = False) -> Path:
    """The interpreter of an environment where ray, torch and this checkout import
    (``rllib_only``: ray and torch only, what ``.ci/run`` makes ahead of the project's install,
    which must not run beside another editable install of the same checkout)."""
    given = os.environ.get("RLSERVE_RAY_PYTHON")
    if given:
        return Path(given)
    root = _venv_dir()
    root.parent.mkdir(parents=True, exist_ok=True)
    python = root / "bin" / "python"
    stamp_file = root / "rlserve-stamp.txt"
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other maker finishes first; then its stamp holds
        stamp = stamp_file.read_text() if stamp_file.is_file() else ""
        if stamp == _stamp():
            return python
        if not stamp.startswith(" ".join(RLLIB)) or not python.is_file():
            venv.EnvBuilder(with_pip=True, clear=True).create(root)
            _pip(python, *RLLIB)
            stamp_file.write_text(f"{' '.join(RLLIB)}\n")
        if rllib_only:
            return python
        _pip(python, "-e", f"{REPO_ROOT}[torch]")
        stamp_file.write_text(_stamp())
    return python


if __name__ == "__main__":
    print(ray_python(rllib_only="--rllib-only" in sys.argv[1:]))
