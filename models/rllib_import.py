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

import collections
import io
import os
import pickle
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

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
            target.copy_(torch.as_tensor(np.ascontiguousarray(value)).to(target.dtype))
    return model


def read_weights_file(path: str | os.PathLike[str], policy_id: str | None = None) -> dict[str, np.ndarray]:
    """RLlib-named weights from an ``.npz`` (read without pickles) or an RLlib checkpoint.

    A checkpoint may be an Algorithm checkpoint directory (``policies/<id>/``; pass
    ``policy_id`` when it holds several), a policy directory, a ``policy_state.pkl`` or a
    pre-2.0 ``checkpoint-N`` file. Pickles are read by a restricted unpickler that builds
    only numpy arrays and plain containers: every other global it names becomes an inert
    placeholder, so no code from the file runs. msgpack checkpoints are not supported.
    """
    path = Path(path)
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    state_file = _policy_state_file(path, policy_id)
    if state_file.suffix == ".msgpck":
        raise WeightImportError(
            f"{state_file}: msgpack checkpoints are not supported; export the policy with "
            "checkpoint_format='cloudpickle' or save policy.get_weights() with numpy.savez"
        )
    with state_file.open("rb") as fh:
        state = _SafeUnpickler(fh).load()
    return _weights_from_state(state, state_file, policy_id)


def _policy_state_file(path: Path, policy_id: str | None) -> Path:
    if path.is_file():
        return path
    for name in ("policy_state.pkl", "policy_state.msgpck"):
        if (path / name).is_file():
            return path / name
    policies = path / "policies"
    found = sorted(p.name for p in policies.iterdir() if p.is_dir()) if policies.is_dir() else []
    if not found:
        raise WeightImportError(f"{path}: no .npz, policy_state file or policies/<id>/ directory found")
    if policy_id is None and len(found) > 1:
        raise WeightImportError(f"{path}: holds policies {found}; pass policy_id to pick one")
    chosen = policy_id if policy_id is not None else found[0]
    if chosen not in found:
        raise WeightImportError(f"{path}: no policy {chosen!r}; available: {found}")
    return _policy_state_file(policies / chosen, None)


class _Opaque:
    """Stands in for any global a checkpoint names: accepts everything, runs nothing."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __call__(self, *args: object, **kwargs: object) -> _Opaque:
        return _Opaque()

    def __setstate__(self, state: object) -> None:
        pass

    def __setitem__(self, key: object, value: object) -> None:
        pass

    def append(self, value: object) -> None:
        pass

    def extend(self, values: object) -> None:
        pass


def _latin1_bytes(text: str, encoding: str = "latin1") -> bytes:
    """Protocol-2 pickles spell bytes as ``_codecs.encode(text, 'latin1')``; nothing else is allowed."""
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise WeightImportError(f"checkpoint pickle asks for encoding {encoding!r}; only latin1 bytes are read")
    return text.encode("latin1")


def _allowed_globals() -> dict[tuple[str, str], object]:
    # Taken from numpy's own reductions so the names match this numpy's module layout.
    # __reduce__ is typed "str | tuple"; a str is only for singletons, not these.
    reconstruct = cast(tuple[Any, ...], np.zeros(1).__reduce__())[0]
    scalar = cast(tuple[Any, ...], np.float32(0).__reduce__())[0]
    # Protocol-5 pickles rebuild arrays with this one.
    frombuffer = cast(tuple[Any, ...], np.zeros(1).__reduce_ex__(5))[0]
    allowed: dict[tuple[str, str], object] = {
        (reconstruct.__module__, reconstruct.__name__): reconstruct,
        (scalar.__module__, scalar.__name__): scalar,
        (frombuffer.__module__, frombuffer.__name__): frombuffer,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): _latin1_bytes,
        ("collections", "OrderedDict"): collections.OrderedDict,
    }
    for legacy in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(legacy, "_reconstruct")] = reconstruct
        allowed[(legacy, "scalar")] = scalar
    for legacy in ("numpy.core.numeric", "numpy._core.numeric"):
        allowed[(legacy, "_frombuffer")] = frombuffer
    allowed.update({("numpy", t.__name__): t for t in (np.float32, np.float64, np.int64, np.int32)})
    return allowed


class _SafeUnpickler(pickle.Unpickler):
    _allowed = _allowed_globals()

    def find_class(self, module: str, name: str) -> object:
        return self._allowed.get((module, name), _Opaque)

    def persistent_load(self, pid: object) -> object:
        return _Opaque()


def _weights_from_state(state: object, source: Path, policy_id: str | None) -> dict[str, np.ndarray]:
    if isinstance(state, dict) and isinstance(state.get("worker"), bytes):
        # Pre-2.0 checkpoint: the rollout worker's state is itself pickled inside.
        worker = _SafeUnpickler(io.BytesIO(state["worker"])).load()
        per_policy = worker.get("state", {}) if isinstance(worker, dict) else {}
        ids = sorted(per_policy)
        chosen = policy_id or (ids[0] if len(ids) == 1 else "default_policy")
        state = per_policy.get(chosen)
    weights = state.get("weights") if isinstance(state, dict) else None
    if not isinstance(weights, dict) or not weights:
        raise WeightImportError(f"{source}: no policy 'weights' dictionary found")
    bad = [k for k, v in weights.items() if not (isinstance(v, np.ndarray) and v.dtype.kind in "fiub")]
    if bad or not all(isinstance(k, str) for k in weights):
        raise WeightImportError(f"{source}: weights must be numeric arrays under string keys; not so for {bad}")
    return dict(weights)
