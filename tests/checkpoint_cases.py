"""Loader for real RLlib checkpoints with RLlib's recorded answers.

Format: ``shared/oracle/checkpoints/README.md`` (one folder per case: ``checkpoint/``,
``reference.json``, ``reference.npz``, ``episode_states.npz`` for recurrent cases).

Cases come from two folders: ``RLSERVE_CHECKPOINT_DIR`` (default
``../shared/oracle/checkpoints`` relative to the repository root), so other folders of the
same format can be run, and this repository's ``tests/fixtures/checkpoints`` (written by
``scripts/record_rllib_checkpoint.py``). Tests select cases by what they hold, never by name.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
OWN_CASES = REPO_ROOT / "tests" / "fixtures" / "checkpoints"


def checkpoint_dir() -> Path:
    env = os.environ.get("RLSERVE_CHECKPOINT_DIR")
    if env:
        return Path(env).expanduser().resolve()
    return (REPO_ROOT / ".." / "shared" / "oracle" / "checkpoints").resolve()


def _cases_in(root: Path, multi_agent: bool = False) -> list[Path]:
    if not root.is_dir():
        return []
    found = (p for p in root.iterdir() if (p / "reference.json").is_file() and (p / "checkpoint").is_dir())
    return sorted(p for p in found if _is_multi_agent(p) == multi_agent)


@cache
def _is_multi_agent(case: Path) -> bool:
    """A policy set's case (``scripts/record_rllib_multiagent.py``): its answers are per agent."""
    return bool(json.loads((case / "reference.json").read_text()).get("multi_agent"))


def case_ids() -> list[str]:
    """``<folder label>/<case folder>`` for every single-policy case in both folders."""
    ids = [f"shared/{p.name}" for p in _cases_in(checkpoint_dir())]
    return ids + [f"own/{p.name}" for p in _cases_in(OWN_CASES)]


def multi_agent_case_ids() -> list[str]:
    """The multi-policy (multi-agent) cases, whose answers are per agent."""
    ids = [f"shared/{p.name}" for p in _cases_in(checkpoint_dir(), multi_agent=True)]
    return ids + [f"own/{p.name}" for p in _cases_in(OWN_CASES, multi_agent=True)]


def case_path(case_id: str) -> Path:
    label, _, name = case_id.partition("/")
    return (checkpoint_dir() if label == "shared" else OWN_CASES) / name


@dataclass
class CheckpointCase:
    id: str
    path: Path
    reference: dict[str, Any]
    states: dict[str, np.ndarray]  # episode_states.npz ({} for feedforward cases)

    @property
    def checkpoint(self) -> Path:
        return self.path / "checkpoint"

    @property
    def recurrent(self) -> bool:
        return bool(self.reference.get("recurrent"))


@cache
def load_checkpoint_case(case_id: str) -> CheckpointCase:
    path = case_path(case_id)
    reference = json.loads((path / "reference.json").read_text())
    states: dict[str, np.ndarray] = {}
    if (path / "episode_states.npz").is_file():
        with np.load(path / "episode_states.npz", allow_pickle=False) as z:
            states = {k: z[k] for k in z.files}
    return CheckpointCase(case_id, path, reference, states)


def exported_checkpoint(tmp_path_factory: Any, case: CheckpointCase) -> Path:
    """``rlserve export CHECKPOINT --name NAME`` (its main, in this process) of ``case``, named
    ``model_name(case)``: done once per test run for every test and xdist worker (``run_cache``)."""
    from run_cache import shared_folder

    from rlserve.models.export.cli import export_main

    def build(out: Path) -> None:
        rc = export_main([str(case.checkpoint), "--out", str(out), "--name", model_name(case), "--quiet"])
        assert rc == 0, f"rlserve export {case.checkpoint} exited {rc}"

    return shared_folder(tmp_path_factory, f"checkpoint-exports/{model_name(case)}", build)


def model_name(case: CheckpointCase) -> str:
    """The case's model name where it is served (its id, a folder name)."""
    return case.id.replace("/", "-")
