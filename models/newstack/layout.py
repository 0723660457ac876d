"""Where a new-API-stack (RLModule) checkpoint keeps a module and its connectors (torch-free).

RLlib's new stack writes every component as a ``Checkpointable`` directory: a JSON
``metadata.json`` (``rllib_checkpoint.json`` for the Algorithm), ``class_and_ctor_args.pkl``
and a state file (``*.pkl`` or ``*.msgpack``); sub-components are subdirectories::

    ALGORITHM/                                rllib_checkpoint.json, class_and_ctor_args.pkl
        env_runner/                           the local EnvRunner
            env_to_module_connector/          the env-to-module pipeline (+ a directory per
            module_to_env_connector/          stateful connector, e.g. MeanStdFilter/)
        learner_group/learner/rl_module/      always a MultiRLModule
            <module_id>/                      class_and_ctor_args.pkl, module_state.pkl|.msgpack

(With remote EnvRunners the two connector directories sit at the algorithm's top level.)
``locate_module`` accepts the algorithm directory, ``learner_group/learner/rl_module`` or one
module's directory, and walks up from a module to the algorithm that holds its connectors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlserve.models.checkpoint.errors import CheckpointError

__all__ = [
    "ModuleFiles",
    "algorithm_root",
    "checkpoint_module_ids",
    "is_new_stack",
    "locate_module",
    "module_ids",
    "read_metadata",
]

CTOR_FILE = "class_and_ctor_args.pkl"
MODULE_STATE = ("module_state.pkl", "module_state.msgpack")
RL_MODULE_DIR = Path("learner_group") / "learner" / "rl_module"
_CONNECTOR_HOMES = (Path("env_runner"), Path("."))  # local EnvRunner first, then remote runners' copy


@dataclass(frozen=True)
class ModuleFiles:
    """The files of one RLModule and, when known, of the algorithm around it."""

    module_id: str
    directory: Path  # the module's own directory
    state_file: Path  # module_state.pkl or module_state.msgpack
    algorithm: Path | None  # the algorithm directory (None: a module saved on its own)
    env_to_module: Path | None  # the env-to-module pipeline's directory, if written
    module_to_env: Path | None

    @property
    def format(self) -> str:
        return "msgpack" if self.state_file.suffix == ".msgpack" else "pickle"

    @property
    def env_runner_state(self) -> Path | None:
        if self.algorithm is None:
            return None
        return next((p for p in (self.algorithm / "env_runner" / f"state{s}" for s in (".pkl", ".msgpack"))
                     if p.is_file()), None)


def _state_file(directory: Path) -> Path | None:
    return next((directory / n for n in MODULE_STATE if (directory / n).is_file()), None)


def _is_module_dir(directory: Path) -> bool:
    return (directory / CTOR_FILE).is_file() and _state_file(directory) is not None


def is_new_stack(path: str | Path) -> bool:
    """True for a new-stack checkpoint directory (algorithm, MultiRLModule or RLModule):
    every such component holds a ``class_and_ctor_args.pkl``; old-stack checkpoints never do."""
    path = Path(path)
    try:
        return path.is_dir() and (path / CTOR_FILE).is_file()
    except OSError:
        return False


def module_ids(rl_module_dir: Path) -> list[str]:
    """The ids of the modules of a MultiRLModule directory (its module subdirectories)."""
    if not rl_module_dir.is_dir():
        return []
    return sorted(p.name for p in rl_module_dir.iterdir() if p.is_dir() and _is_module_dir(p))


def checkpoint_module_ids(path: str | Path) -> list[str]:
    """The ids of every module ``locate_module`` can pick at ``path`` (an algorithm directory,
    ``rl_module`` or one module's directory); [] where there are none."""
    path = Path(path)
    if not is_new_stack(path):
        return []
    if (path / RL_MODULE_DIR).is_dir():
        return module_ids(path / RL_MODULE_DIR)
    return module_ids(path) or ([path.name] if _is_module_dir(path) else [])


def read_metadata(directory: Path) -> dict[str, Any]:
    """A component's ``metadata.json`` (or the algorithm's ``rllib_checkpoint.json``); {} if absent."""
    for name in ("metadata.json", "rllib_checkpoint.json"):
        path = directory / name
        if path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise CheckpointError(f"{path}: not valid JSON: {exc}") from None
            return data if isinstance(data, dict) else {}
    return {}


def _pick(rl_module_dir: Path, module_id: str | None, shown: Path) -> Path:
    ids = module_ids(rl_module_dir)
    if not ids:
        raise CheckpointError(
            f"{shown}: no RLModule found: expected {RL_MODULE_DIR}/<module_id>/ with {CTOR_FILE} and "
            f"{' or '.join(MODULE_STATE)}"
        )
    if module_id is None:
        if len(ids) > 1:
            raise CheckpointError(f"{shown}: holds modules {ids}; pass --module-id (or --policy-id) to pick one, "
                                  f"or give one module's directory ({rl_module_dir}/<module_id>)")
        module_id = ids[0]
    if module_id not in ids:
        raise CheckpointError(f"{shown}: no module {module_id!r}; available: {ids}")
    return rl_module_dir / module_id


def _algorithm_of(module_dir: Path) -> Path | None:
    """The algorithm directory three levels above ``.../learner_group/learner/rl_module/<id>``."""
    rl_module = module_dir.parent
    if rl_module.name != RL_MODULE_DIR.name or rl_module.parent.name != "learner":
        return None
    root = rl_module.parent.parent.parent
    return root if (root / CTOR_FILE).is_file() and rl_module.parent.parent.name == "learner_group" else None


def algorithm_root(path: str | Path) -> Path | None:
    """The algorithm directory a new-stack module or ``rl_module`` directory belongs to (its
    connectors live there), the path itself for an algorithm directory, else None."""
    path = Path(path)
    if (path / RL_MODULE_DIR).is_dir():
        return path
    if path.name == RL_MODULE_DIR.name:
        return _algorithm_of(path / "_")
    return _algorithm_of(path)


def _connector_dir(algorithm: Path | None, name: str) -> Path | None:
    if algorithm is None:
        return None
    return next((algorithm / home / name for home in _CONNECTOR_HOMES
                 if (algorithm / home / name / CTOR_FILE).is_file()), None)


def locate_module(path: str | Path, module_id: str | None = None) -> ModuleFiles:
    """The files of one module of the new-stack checkpoint at ``path`` (see the module docstring)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    if not is_new_stack(path):
        raise CheckpointError(f"{path}: not a new-API-stack checkpoint directory (no {CTOR_FILE})")
    # A MultiRLModule directory also holds a (empty) module_state: look for modules below first.
    if (path / RL_MODULE_DIR).is_dir():
        module_dir = _pick(path / RL_MODULE_DIR, module_id, path)
    elif module_ids(path):
        module_dir = _pick(path, module_id, path)
    elif _is_module_dir(path):
        module_dir = path
        if module_id is not None and module_id != path.name:
            raise CheckpointError(f"{path} is module {path.name!r}, not {module_id!r}")
    else:
        raise CheckpointError(
            f"{path}: no RLModule found; pass the algorithm directory, {RL_MODULE_DIR} or one module's directory"
        )
    state = _state_file(module_dir)
    assert state is not None  # _is_module_dir / module_ids checked it
    algorithm = _algorithm_of(module_dir)
    return ModuleFiles(
        module_id=module_dir.name, directory=module_dir, state_file=state, algorithm=algorithm,
        env_to_module=_connector_dir(algorithm, "env_to_module_connector"),
        module_to_env=_connector_dir(algorithm, "module_to_env_connector"),
    )
