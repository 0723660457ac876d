"""A virtual environment with openpi's robot client, for the openpi route's tests.

``openpi-client`` (what LeRobot and other robot stacks call) pins numpy<2, which rlserve's
own environment does not hold, so the tests run it as a robot would: in an environment of
its own, against a real server.

    openpi_python() -> Path   an interpreter with openpi-client and gymnasium (CartPole)

``RLSERVE_OPENPI_PYTHON`` names an interpreter to use as it is. Otherwise the environment
lives in ``RLSERVE_OPENPI_VENV`` (default ``~/.cache/rlserve-tests/openpi-client-0.1.2-py<X.Y>``),
made under a file lock (xdist workers, or ``.ci/run`` starting it early in the background:
it takes ~45 s of pip on the 2-core machine) and reused while its stamp holds. Run as a
script, it makes the environment and says where.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import venv
from pathlib import Path

PACKAGES = ("openpi-client==0.1.2", "gymnasium==1.4.0")
_TAG = f"openpi-client-0.1.2-py{sys.version_info.major}.{sys.version_info.minor}"


def _venv_dir() -> Path:
    env = os.environ.get("RLSERVE_OPENPI_VENV")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rlserve-tests" / _TAG


def openpi_python() -> Path:
    given = os.environ.get("RLSERVE_OPENPI_PYTHON")
    if given:
        return Path(given)
    root = _venv_dir()
    root.parent.mkdir(parents=True, exist_ok=True)
    python, stamp_file, stamp = root / "bin" / "python", root / "rlserve-stamp.txt", " ".join(PACKAGES) + "\n"
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another maker finishes first; then its stamp holds
        if python.is_file() and stamp_file.is_file() and stamp_file.read_text() == stamp:
            return python
        venv.EnvBuilder(with_pip=True, clear=True).create(root)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_USER")}
        env.update(PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", *PACKAGES], env=env, capture_output=True,
                              text=True, timeout=900)
        if done.returncode:
            raise RuntimeError(f"making the openpi-client environment failed:\n{done.stdout[-3000:]}\n"
                               f"{done.stderr[-3000:]}")
        stamp_file.write_text(stamp)
    return python


if __name__ == "__main__":
    print(openpi_python())
