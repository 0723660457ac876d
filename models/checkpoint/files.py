"""Where an RLlib checkpoint keeps a policy, and reading its state files (torch-free).

RLlib 2.x (old API stack) writes::

    CHECKPOINT/                      an Algorithm checkpoint
        rllib_checkpoint.json        {"type": "Algorithm", "format": "cloudpickle"|"msgpack", ...}
        algorithm_state.pkl          config, worker state (incl. the worker's filters), counters
        policies/<policy_id>/        one Policy checkpoint per policy:
            rllib_checkpoint.json    {"type": "Policy", ...}
            policy_state.pkl         weights, policy_spec (spaces, config), connector_configs

msgpack checkpoints use the same layout with ``*.msgpck`` files (numpy arrays encoded as
``msgpack_numpy`` does). ``locate`` accepts any of: the algorithm directory, a policy
directory, a ``policy_state`` file, or a pre-2.0 ``checkpoint-N`` pickle.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlserve.models.checkpoint.errors import CheckpointError
from rlserve.models.checkpoint.unpickler import load_pickle, load_pickle_bytes

__all__ = ["CheckpointFiles", "algorithm_worker_state", "locate", "read_msgpack", "read_state"]

_POLICY_STATE = ("policy_state.pkl", "policy_state.msgpck")
_ALGORITHM_STATE = ("algorithm_state.pkl", "algorithm_state.msgpck")


@dataclass(frozen=True)
class CheckpointFiles:
    """The files that hold one policy: its state file and, when it is part of an
    Algorithm checkpoint, the algorithm's state file (the rollout worker's filters)."""

    policy_state: Path
    policy_id: str | None
    algorithm_state: Path | None
    info: dict[str, Any]  # the policy's rllib_checkpoint.json ({} when absent)

    @property
    def format(self) -> str:
        return "msgpack" if self.policy_state.suffix == ".msgpck" else "cloudpickle"


def _first_file(directory: Path, names: tuple[str, ...]) -> Path | None:
    return next((directory / n for n in names if (directory / n).is_file()), None)


def policy_ids(checkpoint_dir: Path) -> list[str]:
    """The policy ids of an algorithm checkpoint (its `policies/<policy_id>/` holding a policy state)."""
    policies = checkpoint_dir / "policies"
    if not policies.is_dir():
        return []
    return sorted(p.name for p in policies.iterdir() if _first_file(p, _POLICY_STATE) is not None)


def _read_info(directory: Path) -> dict[str, Any]:
    path = directory / "rllib_checkpoint.json"
    if not path.is_file():
        return {}
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON: {exc}") from None
    return info if isinstance(info, dict) else {}


def _for_policy_file(state_file: Path) -> CheckpointFiles:
    policy_dir = state_file.parent
    in_algorithm = policy_dir.parent.name == "policies"
    algorithm_state = _first_file(policy_dir.parent.parent, _ALGORITHM_STATE) if in_algorithm else None
    return CheckpointFiles(
        policy_state=state_file,
        policy_id=policy_dir.name if in_algorithm else None,
        algorithm_state=algorithm_state,
        info=_read_info(policy_dir),
    )


def _pick_policy(checkpoint_dir: Path, policy_id: str | None) -> CheckpointFiles:
    ids = policy_ids(checkpoint_dir)
    if not ids:
        raise CheckpointError(
            f"{checkpoint_dir}: no policy found: expected policies/<policy_id>/policy_state.pkl "
            "(an RLlib Algorithm checkpoint), or policy_state.pkl itself (a Policy checkpoint)"
        )
    if policy_id is None and len(ids) > 1:
        raise CheckpointError(f"{checkpoint_dir}: holds policies {ids}; pass --policy-id (policy_id) to pick one, "
                              "or an agent mapping (--mapping FILE, --map AGENT=POLICY, --default-policy ID) to "
                              "export them all as a policy set")
    chosen = ids[0] if policy_id is None else policy_id
    if chosen not in ids:
        raise CheckpointError(f"{checkpoint_dir}: no policy {chosen!r} under policies/; available: {ids}")
    state_file = _first_file(checkpoint_dir / "policies" / chosen, _POLICY_STATE)
    assert state_file is not None  # policy_ids lists only directories holding one
    return _for_policy_file(state_file)


def _algorithm_state_hint(path: Path) -> CheckpointError:
    ids = policy_ids(path.parent)
    where = (f"policies/<policy_id>/policy_state{'.msgpck' if path.suffix == '.msgpck' else '.pkl'} "
             f"(policy ids here: {ids})")
    return CheckpointError(
        f"{path} is the algorithm's state (config, counters, worker filters), not a policy's: the "
        f"weights are in {path.parent}/{where}; pass the checkpoint directory {path.parent} instead"
    )


def locate(path: str | Path, policy_id: str | None = None) -> CheckpointFiles:
    """The files of one policy in the checkpoint at ``path`` (see the module docstring)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    if path.is_file():
        if path.name in _ALGORITHM_STATE:
            raise _algorithm_state_hint(path)
        files = _for_policy_file(path)
    elif _first_file(path, _POLICY_STATE) is not None:
        files = _for_policy_file(_first_file(path, _POLICY_STATE))  # type: ignore[arg-type]
    else:
        return _pick_policy(path, policy_id)
    if policy_id is not None and files.policy_id is not None and policy_id != files.policy_id:
        raise CheckpointError(f"{path} holds policy {files.policy_id!r}, not {policy_id!r}")
    return files


# --------------------------------------------------------------------------- state files

def read_state(path: Path) -> Any:
    """A state file as data: ``*.msgpck`` through msgpack, anything else as a pickle."""
    if path.suffix == ".msgpck":
        return read_msgpack(path)
    return load_pickle(path)


def read_msgpack(path: Path) -> Any:
    """A msgpack state file as data (numpy arrays as ``msgpack_numpy`` encodes them)."""
    try:
        import msgpack  # type: ignore[import-untyped]  # ships no type information
    except ImportError:
        raise CheckpointError(
            f"{path}: reading msgpack checkpoints needs the msgpack package "
            "(pip install msgpack, or install rlserve with the [torch] extra)"
        ) from None
    try:
        return msgpack.unpackb(
            path.read_bytes(), raw=False, strict_map_key=False, object_hook=lambda d: _numpy_from_msgpack(d, path)
        )
    except CheckpointError:
        raise
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise CheckpointError(f"{path}: not a readable msgpack file ({type(exc).__name__}: {exc})") from None


def _numpy_from_msgpack(obj: dict[Any, Any], path: Path) -> Any:
    """Arrays and numpy scalars as ``msgpack_numpy`` encodes them; object arrays (pickles)
    and structured dtypes are refused."""
    if b"nd" not in obj:
        if b"complex" in obj and isinstance(obj.get(b"data"), str | bytes):
            data = obj[b"data"]
            return complex(data.decode() if isinstance(data, bytes) else data)
        return obj
    kind = obj.get(b"kind", b"")
    type_ = obj.get(b"type")
    if kind not in (b"", "") or not isinstance(type_, str | bytes):
        raise CheckpointError(f"{path}: an array of kind {kind!r} (pickled objects or a structured dtype) is not read")
    dtype = np.dtype(type_.decode() if isinstance(type_, bytes) else type_)
    if dtype.hasobject:
        raise CheckpointError(f"{path}: an object array (pickled Python objects) is not read")
    values = np.frombuffer(obj[b"data"], dtype=dtype)
    if obj[b"nd"] is True:
        return values.reshape(tuple(obj[b"shape"])).copy()
    return values[0]


def algorithm_worker_state(files: CheckpointFiles) -> Mapping[str, Any] | None:
    """The rollout worker's state from the algorithm's state file (None when there is none)."""
    if files.algorithm_state is None:
        return None
    state = read_state(files.algorithm_state)
    worker = state.get("worker") if isinstance(state, Mapping) else None
    if isinstance(worker, bytes):  # pre-2.0: the worker state is pickled once more
        worker = load_pickle_bytes(worker, f"{files.algorithm_state} ['worker']")
    return worker if isinstance(worker, Mapping) else None
