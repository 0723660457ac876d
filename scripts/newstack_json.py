"""How record_newstack_cases.py writes RLlib's answers: spaces as JSON, tensors and nested
dicts as numpy, values as JSON, rows stacked and flattened into reference.npz keys, and the
large rows of reference.json left to reference.npz (``externalize``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

# --------------------------------------------------------------------------- JSON helpers

def _num(x: float) -> Any:
    return x if np.isfinite(x) else ("inf" if x > 0 else ("-inf" if x < 0 else "nan"))


def _bound(arr: np.ndarray) -> Any:
    flat = np.ravel(arr).astype(np.float64)
    if flat.size and np.all(flat == flat[0]):
        return _num(float(flat[0]))
    return np.vectorize(_num, otypes=[object])(arr.astype(np.float64)).tolist()


def space_json(space: gym.Space) -> dict[str, Any]:
    if isinstance(space, gym.spaces.Box):
        return {"type": "Box", "low": _bound(space.low), "high": _bound(space.high), "shape": list(space.shape),
                "dtype": str(space.dtype)}
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": space.nvec.tolist(), "start": space.start.tolist(),
                "dtype": str(space.dtype)}
    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict", "keys": list(space.spaces),
                "spaces": {k: space_json(s) for k, s in space.spaces.items()}}
    if isinstance(space, gym.spaces.Tuple):
        return {"type": "Tuple", "spaces": [space_json(s) for s in space.spaces]}
    raise TypeError(f"no JSON for {space}")


def _np(value: Any) -> Any:
    """Tensors and nested dicts as numpy (first in any tuple)."""
    import torch

    if isinstance(value, dict):
        return {k: _np(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    return value


def _stack(rows: list[Any]) -> Any:
    if isinstance(rows[0], dict):
        return {k: _stack([r[k] for r in rows]) for k in rows[0]}
    return np.stack([np.asarray(r) for r in rows])


def _flat_keys(prefix: str, value: Any, out: dict[str, np.ndarray]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat_keys(f"{prefix}/{k}", v, out)
    else:
        out[prefix] = np.asarray(value)


def externalize(reference: dict[str, Any], limit: int = 200) -> dict[str, Any]:
    """Rows of ``fixed`` with more than ``limit`` numbers (images) are left to reference.npz:
    ``"see reference.npz: fixed/<field>[/<key>]"`` per row, as the shared cases do; an
    episode's module inputs that large are not kept."""

    def size(value: Any) -> int:
        if isinstance(value, dict):
            return sum(size(v) for v in value.values())
        if isinstance(value, list | tuple):  # also ragged rows, e.g. a Tuple action [a1, [a2]]
            return sum(size(v) for v in value)
        return int(np.asarray(value).size)

    def refer(value: list[Any], key: str) -> Any:
        if value and isinstance(value[0], dict):
            return {k: refer([row[k] for row in value], f"{key}/{k}") for k in value[0]}
        return [f"see reference.npz: {key}"] * len(value)

    for field, rows in reference["fixed"].items():
        if isinstance(rows, list) and rows and not isinstance(rows[0], str) and size(rows[0]) > limit:
            reference["fixed"][field] = refer(rows, f"fixed/{field}")
    episode = reference.get("episode")
    if episode and episode.get("connector_out") and size(episode["connector_out"][0]) > limit:
        del episode["connector_out"]  # stacked images: what the module saw follows from obs and the state
    return reference
