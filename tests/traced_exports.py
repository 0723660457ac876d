"""Custom-module cases exported by tracing, with the real command line in an RLlib environment.

``export_traced(case, module_id, out)`` runs ``rlserve export CHECKPOINT --trust-code`` with
the interpreter of ``ray_venv.ray_python()`` (ray, torch and this checkout) and returns the
bundle's directory; the tests then serve it from this environment, which has no ray.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from newstack_cases import NewStackCase
from ray_venv import ray_python

from rlserve.models.newstack.layout import RL_MODULE_DIR

__all__ = ["export_traced", "rlserve_in_ray_env"]


def rlserve_in_ray_env() -> list[str]:
    return [str(ray_python()), "-m", "rlserve.service.cli"]


def export_traced(case: NewStackCase, module_id: str, out: Path, *extra: str) -> Path:
    """The module's bundle at ``out`` (a multi-agent case's module named by ``--module-id``)."""
    argv = [*rlserve_in_ray_env(), "export", str(case.checkpoint), "--out", str(out), "--trust-code", "--quiet",
            *extra]
    if len(case.module_ids) > 1:
        argv += ["--module-id", module_id]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-4000:]}"
    assert (out / "manifest.json").is_file()
    return out


def module_dir(case: NewStackCase, module_id: str) -> Path:
    return case.checkpoint / RL_MODULE_DIR / module_id
