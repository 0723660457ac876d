"""What case.json says of a recorded RLlib case besides its io: spaces and config as JSON,
the weights' perturbation and metadata (init statistics, aliases, parameters the outputs
reach), the action distribution and the preprocessor layout. Imported by
record_rllib_cases.py (ray's environment).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# ---------------------------------------------------------------- spaces and config as JSON


def _number(x: float) -> Any:
    x = float(x)
    if np.isnan(x):
        return "nan"
    if np.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _bound(arr: np.ndarray) -> Any:
    flat = np.asarray(arr, np.float64).ravel()
    if flat.size and np.all(flat == flat[0]):
        return _number(flat[0])
    return np.vectorize(_number, otypes=[object])(np.asarray(arr, np.float64)).tolist()


def space_json(space: Any) -> dict[str, Any]:
    from gymnasium import spaces as gs

    if isinstance(space, gs.Box):
        return {"type": "Box", "low": _bound(space.low), "high": _bound(space.high),
                "shape": list(space.shape), "dtype": str(space.dtype)}
    if isinstance(space, gs.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gs.Dict):
        keys = list(space.spaces)
        return {"type": "Dict", "keys": keys, "spaces": {k: space_json(space.spaces[k]) for k in keys}}
    if isinstance(space, gs.Tuple):
        return {"type": "Tuple", "spaces": [space_json(s) for s in space.spaces]}
    raise TypeError(f"no JSON form for {space!r} in this script")


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, str | int | bool) or value is None:
        return value
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return repr(value)


# ---------------------------------------------------------------- weights


def _perturb(model: Any, gen: Any) -> None:
    import torch

    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() >= 2:
                fan_in = int(np.prod(p.shape[1:]))
                p.add_(torch.randn(p.shape, generator=gen) * 0.5 / np.sqrt(fan_in))
            else:
                p.add_(torch.randn(p.shape, generator=gen) * 0.2)


def _init_stats(state: dict[str, Any]) -> dict[str, Any]:
    stats = {}
    for key, tensor in state.items():
        a = tensor.detach().double().numpy()
        entry = {"min": float(a.min()), "max": float(a.max()), "mean": float(a.mean()), "std": float(a.std())}
        if a.ndim >= 2:
            norms = np.linalg.norm(a.reshape(a.shape[0], -1), axis=1)
            entry.update(row_norm_min=float(norms.min()), row_norm_max=float(norms.max()))
        stats[key] = entry
    return stats


def _weights_meta(model: Any, init_stats: dict[str, Any], reached: set[str]) -> dict[str, Any]:
    state = model.state_dict(keep_vars=True)
    params = dict(model.named_parameters(remove_duplicate=False))
    by_ptr: dict[int, list[str]] = {}
    for key, tensor in state.items():
        by_ptr.setdefault(tensor.data_ptr(), []).append(key)
    unique = {keys[0]: state[keys[0]] for keys in by_ptr.values()}
    return {
        "num_keys": len(state),
        "num_unique_tensors": len(unique),
        "num_parameters_unique": int(sum(t.numel() for k, t in unique.items() if k in params)),
        "buffer_keys": sorted(k for k in state if k not in params),
        "aliased_keys": [keys for keys in by_ptr.values() if len(keys) > 1],
        "unreached_keys": sorted(k for k in params if k not in reached),
        "shapes": {k: list(t.shape) for k, t in state.items()},
        "init": "RLlib's own initialisation (torch.manual_seed(seed) before get_model_v2) followed by perturb(): "
        "W += N(0,1)*0.5/sqrt(fan_in) for dim>=2 params, += N(0,0.2^2) for 1-D params; buffers untouched "
        "unless the case's notes say otherwise. init_stats = per-key stats of the unperturbed RLlib init.",
        "init_stats": init_stats,
    }


def _reached_parameters(model: Any, outputs: list[Any]) -> set[str]:
    """Parameters with a gradient path to the given outputs (model_out and value)."""
    import torch

    params = dict(model.named_parameters(remove_duplicate=False))
    total = sum(o.float().sum() for o in outputs if o.requires_grad)
    grads = torch.autograd.grad(total, list(params.values()), allow_unused=True)
    return {k for (k, _), g in zip(params.items(), grads, strict=True) if g is not None}


def _dist_meta(dist_class: Any) -> dict[str, Any]:
    import functools

    kwargs: dict[str, Any] = {}
    cls = dist_class
    if isinstance(dist_class, functools.partial):
        cls = dist_class.func
        kwargs = {k: (space_json(v) if hasattr(v, "sample") else _jsonable(v)) for k, v in dist_class.keywords.items()}
    return {"class": cls.__name__, "module": cls.__module__, "kwargs": kwargs}


def _preprocessor_meta(prep: Any, obs_space: Any) -> dict[str, Any]:
    from gymnasium import spaces as gs
    from ray.rllib.models.preprocessors import DictFlatteningPreprocessor, NoPreprocessor

    shape = [int(d) for d in prep.shape]
    meta = {"class": type(prep).__name__, "output_shape": shape, "size": int(prep.size),
            "options": {"dim": 84, "grayscale": False, "zero_mean": True}}
    if isinstance(prep, NoPreprocessor):
        layout = [{"path": "obs", "preprocessor": type(prep).__name__, "offset": 0, "size": int(prep.size),
                   "output_shape": shape}]
        return {**meta, "layout": layout, "output_dtype": str(np.dtype(obs_space.dtype))}
    if not isinstance(prep, DictFlatteningPreprocessor) or any(
            isinstance(s, gs.Dict | gs.Tuple) for s in obs_space.spaces.values()):
        raise NotImplementedError("this script records NoPreprocessor and one-level Dict observations only")
    layout, offset = [], 0
    for key, leaf in zip(obs_space.spaces, prep.preprocessors, strict=True):
        layout.append({"path": f"obs/{key}", "preprocessor": type(leaf).__name__, "offset": offset,
                       "size": int(leaf.size), "output_shape": [int(d) for d in leaf.shape]})
        offset += int(leaf.size)
    return {**meta, "layout": layout, "output_dtype": "float32"}
