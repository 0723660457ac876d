"""Custom-module cases exported by tracing, with the real command line in an RLlib environment.

``export_traced_all(jobs)`` runs ``rlserve export CHECKPOINT --trust-code`` for each job with
the interpreter of ``ray_venv.ray_python()`` (ray, torch and this checkout), all in one
process, and returns the bundles' directories; the tests then serve them from this
environment, which has no ray.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from newstack_cases import NewStackCase
from ray_venv import ray_python

from rlserve.models.newstack.layout import RL_MODULE_DIR

__all__ = ["export_traced_all", "rlserve_in_ray_env"]


def rlserve_in_ray_env() -> list[str]:
    return [str(ray_python()), "-m", "rlserve.service.cli"]


# ``rlserve export`` for several checkpoints in one process of the RLlib environment: the same
# ``main`` the command runs, once per argument list, so ray's import and the ONNX exporter's
# warm-up (about 6 s of CPU before a process's first model) are paid once, not per module.
_MANY = ("import json, sys\n"
         "from rlserve.service.cli import main\n"
         "codes = [main(argv) for argv in json.loads(sys.argv[1])]\n"
         "print(json.dumps(codes))\n")


def export_traced_all(jobs: list[tuple[NewStackCase, str, Path]], *extra: str) -> list[Path]:
    """Each ``(case, module_id, out)``'s bundle at ``out`` (a multi-agent case's module named by
    ``--module-id``), exported by ``rlserve export CHECKPOINT --trust-code`` in one process."""
    argvs = []
    for case, module_id, out in jobs:
        argv = ["export", str(case.checkpoint), "--out", str(out), "--trust-code", "--quiet", *extra]
        if len(case.module_ids) > 1:
            argv += ["--module-id", module_id]
        argvs.append(argv)
    done = subprocess.run([str(ray_python()), "-c", _MANY, json.dumps(argvs)], capture_output=True, text=True,
                          timeout=300 + 300 * len(jobs))
    assert done.returncode == 0, f"the exports failed ({done.returncode}):\n{done.stderr[-4000:]}"
    codes = json.loads(done.stdout.strip().splitlines()[-1])
    failed = [" ".join(argv) for argv, code in zip(argvs, codes, strict=True) if code != 0]
    assert not failed, f"rlserve {failed[0]} failed ({len(failed)} of {len(argvs)}):\n{done.stderr[-4000:]}"
    for _, _, out in jobs:
        assert (out / "manifest.json").is_file(), out
    return [out for _, _, out in jobs]


def module_dir(case: NewStackCase, module_id: str) -> Path:
    return case.checkpoint / RL_MODULE_DIR / module_id
