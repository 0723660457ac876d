"""Load RLlib (old API stack, torch) policy weights into our models.

Our networks keep RLlib's ``state_dict`` names, so import is mostly a direct copy. Two
declarations on any (sub)module bridge the rest, resolved recursively:

- ``rllib_prefix_map: dict[str, str]`` (our prefix -> RLlib prefix, relative to the module),
  e.g. ``{"base.": ""}``: RLlib's LSTMWrapper *inherits* from the wrapped model, so the
  wrapped model's keys sit at its top level.
- ``rllib_aliases: dict[str, tuple[str, ...]]`` (our prefix -> other RLlib prefixes of the
  same tensors), e.g. ComplexInputNetwork's ``{"cnns.0.": ("cnn_0.",)}``: RLlib registers
  each sub-model twice. Either name is accepted; when both are given they must be equal.

Buffers (e.g. GTrXL's ``inverse_freq``) are copied like parameters, persistent or not.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rlserve.models.checkpoint import (
    CheckpointError,
    load_pickle_bytes,
    locate,
    policy_weights,
    read_state,
)
from rlserve.models.newstack.state import read_state_file

__all__ = ["WeightImportError", "load_rllib_weights", "read_weights_file", "rllib_key_candidates"]


class WeightImportError(ValueError):
    """The weights do not fit the model: lists missing, unexpected and mis-shaped keys."""


def _own_tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from module.named_parameters(recurse=False)
    for name, buf in module.named_buffers(recurse=False):
        if buf is not None:
            yield name, buf


def _apply_prefix_map(key: str, prefix_map: Mapping[str, str]) -> str:
    for ours in sorted(prefix_map, key=len, reverse=True):
        if key.startswith(ours):
            return prefix_map[ours] + key[len(ours):]
    return key


def _alternatives(key: str, aliases: Mapping[str, tuple[str, ...]]) -> list[str]:
    return [alias + key[len(ours):] for ours, names in aliases.items() if key.startswith(ours) for alias in names]


def rllib_key_candidates(module: nn.Module) -> dict[str, list[str]]:
    """Our tensor name -> the RLlib names it may appear under (the first is RLlib's primary)."""
    result: dict[str, list[str]] = {name: [name] for name, _ in _own_tensors(module)}
    for child_name, child in module.named_children():
        for key, names in rllib_key_candidates(child).items():
            result[f"{child_name}.{key}"] = [f"{child_name}.{n}" for n in names]
    prefix_map = getattr(module, "rllib_prefix_map", None) or {}
    aliases = getattr(module, "rllib_aliases", None) or {}
    for key, names in result.items():
        expanded = []
        for name in names:
            expanded += [name, *_alternatives(name, aliases)]
        result[key] = list(dict.fromkeys(_apply_prefix_map(n, prefix_map) for n in expanded))
    return result


def _tensor_of(model: nn.Module, key: str) -> torch.Tensor:
    owner_path, _, leaf = key.rpartition(".")
    owner = model.get_submodule(owner_path) if owner_path else model
    return getattr(owner, leaf)


def _pick(key: str, names: list[str], state: Mapping[str, np.ndarray], problems: list[str]) -> np.ndarray | None:
    present = [n for n in names if n in state]
    if not present:
        return None
    first = np.asarray(state[present[0]])
    for other in present[1:]:
        if not np.array_equal(first, np.asarray(state[other])):
            problems.append(f"aliased keys {present[0]!r} and {other!r} (both {key!r}) hold different values")
    return first


def load_rllib_weights(model: nn.Module, state: Mapping[str, np.ndarray], *, strict: bool = True) -> nn.Module:
    """Copy RLlib-named arrays into ``model`` (in place; returns it).

    Raises ``WeightImportError`` listing every missing key, unexpected key (strict only),
    shape mismatch (expected and received shapes) and disagreeing alias pair.
    """
    candidates = rllib_key_candidates(model)
    problems: list[str] = []
    missing: list[str] = []
    updates: list[tuple[torch.Tensor, np.ndarray]] = []
    consumed: set[str] = set()
    for key, names in candidates.items():
        consumed.update(names)
        value = _pick(key, names, state, problems)
        if value is None:
            missing.append(names[0])
            continue
        target = _tensor_of(model, key)
        if tuple(value.shape) != tuple(target.shape):
            problems.append(f"{names[0]!r}: expected shape {list(target.shape)}, received {list(value.shape)}")
            continue
        updates.append((target, value))
    unexpected = sorted(k for k in state if k not in consumed)
    if strict and missing:
        problems.insert(0, f"missing keys ({len(missing)}): {missing}")
    if strict and unexpected:
        problems.insert(0, f"unexpected keys ({len(unexpected)}): {unexpected}")
    if problems:
        raise WeightImportError(f"weights do not fit {type(model).__name__}: " + "; ".join(problems))
    with torch.no_grad():
        for target, value in updates:
            # reshape: np.ascontiguousarray turns a 0-d array (BatchNorm's num_batches_tracked) into shape (1,).
            target.copy_(torch.as_tensor(np.ascontiguousarray(value)).reshape(target.shape).to(target.dtype))
    return model


def read_weights_file(path: str | os.PathLike[str], policy_id: str | None = None) -> dict[str, np.ndarray]:
    """RLlib-named weights from an ``.npz`` (read without pickles) or an RLlib checkpoint.

    A checkpoint may be an Algorithm checkpoint directory (``policies/<id>/``; pass
    ``policy_id`` when it holds several), a policy directory, a ``policy_state.pkl`` (or
    ``.msgpck``), a pre-2.0 ``checkpoint-N`` file, or a new-stack RLModule's
    ``module_state.pkl`` (or ``.msgpack``: a custom module's weights for a custom model).
    Pickles are read by the data-only unpickler of ``rlserve.models.checkpoint``: no code
    from the file runs, and an object of a class not known to be plain data is refused with
    its name.
    """
    path = Path(path)
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    if path.name in ("module_state.pkl", "module_state.msgpack"):  # a new-stack RLModule's state dict
        return _module_state(path)
    try:
        files = locate(path, policy_id)
        state = read_state(files.policy_state)
        if isinstance(state, dict) and isinstance(state.get("worker"), bytes):
            state = _legacy_policy_state(state, files.policy_state, policy_id)
        return policy_weights(state, files.policy_state)
    except CheckpointError as exc:
        raise WeightImportError(str(exc)) from None


def _module_state(path: Path) -> dict[str, np.ndarray]:
    """An RLModule's ``module_state`` file (new API stack): its state dict, read as data."""
    try:
        state = read_state_file(path)
    except CheckpointError as exc:
        raise WeightImportError(str(exc)) from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, np.ndarray)
                                              for k, v in state.items()):
        raise WeightImportError(f"{path}: expected an RLModule state dict (names -> arrays)")
    return dict(state)


def _legacy_policy_state(state: dict[str, Any], source: Path, policy_id: str | None) -> object:
    """Pre-2.0 checkpoint: the rollout worker's state is itself pickled inside."""
    worker = load_pickle_bytes(state["worker"], f"{source} ['worker']")
    per_policy = worker.get("state", {}) if isinstance(worker, dict) else {}
    ids = sorted(per_policy)
    chosen = policy_id or (ids[0] if len(ids) == 1 else "default_policy")
    return per_policy.get(chosen)
