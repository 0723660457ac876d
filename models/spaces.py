"""Gymnasium spaces to and from the oracle's JSON schema.

The schema (see ``shared/oracle/check_format.md``)::

    Box           {"type":"Box","low":L,"high":H,"shape":[...],"dtype":"float32"}
    Discrete      {"type":"Discrete","n":5,"start":0}
    MultiDiscrete {"type":"MultiDiscrete","nvec":[...],"start":[...],"dtype":"int64"}
    MultiBinary   {"type":"MultiBinary","n":6,"shape":[6],"dtype":"int8"}
    Tuple         {"type":"Tuple","spaces":[S0, S1, ...]}
    Dict          {"type":"Dict","keys":[k0,...],"spaces":{k0:S0,...}}
    Repeated      {"type":"Repeated","child_space":S,"max_len":4}
    Simplex       {"type":"Simplex","shape":[4],"concentration":[...],"dtype":"float32"}

Box bounds are a scalar when every element is equal, else a nested list; non-finite
floats are the strings "inf", "-inf", "nan". One encoder and one decoder per space
type, registered by type, so a new space is a new registration, not a new branch.

This module is torch-free: the server uses it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from gymnasium import spaces as gs

__all__ = [
    "Repeated",
    "float_to_json",
    "Simplex",
    "shape_of",
    "space_from_json",
    "space_to_json",
    "spaces_equal",
]


class Repeated(gs.Space):
    """RLlib's variable-length list space: up to ``max_len`` items of ``child_space``.

    A value is a Python list of child values (``len <= max_len``).
    """

    def __init__(self, child_space: gs.Space, max_len: int, seed: int | None = None):
        if not isinstance(child_space, gs.Space):
            raise TypeError(f"child_space must be a gymnasium Space, got {type(child_space).__name__}")
        if int(max_len) < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        self.child_space = child_space
        self.max_len = int(max_len)
        super().__init__(shape=None, dtype=None, seed=seed)

    def sample(self, mask: Any = None, probability: Any = None) -> list:
        length = int(self.np_random.integers(1, self.max_len + 1))
        return [self.child_space.sample() for _ in range(length)]

    def contains(self, x: Any) -> bool:
        return (
            isinstance(x, list | tuple)
            and len(x) <= self.max_len
            and all(self.child_space.contains(item) for item in x)
        )

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"Repeated({self.child_space!r}, max_len={self.max_len})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Repeated)
            and self.max_len == other.max_len
            and spaces_equal(self.child_space, other.child_space)
        )


class Simplex(gs.Space):
    """RLlib's probability-simplex space: vectors of ``shape`` whose last axis sums to 1.

    ``concentration`` parameterises the Dirichlet used by ``sample``.
    """

    def __init__(
        self,
        shape: tuple[int, ...],
        concentration: Any = None,
        dtype: Any = np.float32,
        seed: int | None = None,
    ):
        shape = tuple(int(d) for d in shape)
        if not shape:
            raise ValueError("Simplex shape must have at least one axis")
        self.dim = shape[-1]
        if concentration is None:
            concentration = np.ones(self.dim, dtype=np.float64)
        self.concentration = np.asarray(concentration, dtype=np.float64)
        if self.concentration.shape != (self.dim,):
            raise ValueError(
                f"concentration must have shape ({self.dim},), got {self.concentration.shape}"
            )
        super().__init__(shape=shape, dtype=dtype, seed=seed)

    @property
    def shape(self) -> tuple[int, ...]:
        """Always set; narrows the base class's ``tuple | None`` (None is for composite spaces)."""
        assert self._shape is not None
        return self._shape

    def sample(self, mask: Any = None, probability: Any = None) -> np.ndarray:
        batch = self.shape[:-1]
        out = self.np_random.dirichlet(self.concentration, size=batch if batch else None)
        return np.asarray(out, dtype=self.dtype).reshape(self.shape)

    def contains(self, x: Any) -> bool:
        arr = np.asarray(x)
        return (
            arr.shape == self.shape
            and bool(np.all(arr >= 0))
            and bool(np.allclose(arr.sum(axis=-1), 1.0, atol=1e-4))
        )

    @property
    def is_np_flattenable(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"Simplex({self.shape}, concentration={self.concentration.tolist()})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Simplex)
            and self.shape == other.shape
            and np.array_equal(self.concentration, other.concentration)
            and np.dtype(self.dtype) == np.dtype(other.dtype)
        )


# --------------------------------------------------------------------------- encoding

def shape_of(space: gs.Space) -> tuple[int, ...]:
    """``space.shape`` for a space that has one (gymnasium types it Optional for composites)."""
    shape = space.shape
    if shape is None:
        raise TypeError(f"{type(space).__name__} has no shape")
    return shape


def float_to_json(value: float) -> float | str:
    """A float as JSON allows it: non-finite values become \"inf\", \"-inf\", \"nan\"."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return float(value)


def _bound_to_json(bound: np.ndarray) -> Any:
    """A scalar when every element is equal, else a nested list of the bound's shape."""
    flat = bound.ravel()
    if flat.size and (np.all(flat == flat[0]) or np.all(np.isnan(flat))):
        first = flat[0]
        return float_to_json(float(first)) if bound.dtype.kind == "f" else int(first)
    if bound.dtype.kind == "f":
        return np.vectorize(float_to_json, otypes=[object])(bound).tolist()
    return bound.tolist()


@functools.singledispatch
def space_to_json(space: gs.Space) -> dict[str, Any]:
    """Encode a space in the oracle's JSON schema."""
    raise ValueError(f"unsupported space type {type(space).__name__}: {space!r}")


@space_to_json.register
def _(space: gs.Box) -> dict[str, Any]:
    return {
        "type": "Box",
        "low": _bound_to_json(space.low),
        "high": _bound_to_json(space.high),
        "shape": list(space.shape),
        "dtype": np.dtype(space.dtype).name,
    }


@space_to_json.register
def _(space: gs.Discrete) -> dict[str, Any]:
    return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}


@space_to_json.register
def _(space: gs.MultiDiscrete) -> dict[str, Any]:
    return {
        "type": "MultiDiscrete",
        "nvec": space.nvec.tolist(),
        "start": space.start.tolist(),
        "dtype": np.dtype(space.dtype).name,
    }


@space_to_json.register
def _(space: gs.MultiBinary) -> dict[str, Any]:
    n = space.n
    return {
        "type": "MultiBinary",
        "n": [int(v) for v in np.ravel(n)] if isinstance(n, tuple | list | np.ndarray) else int(n),
        "shape": list(space.shape),
        "dtype": np.dtype(space.dtype).name,
    }


@space_to_json.register
def _(space: gs.Tuple) -> dict[str, Any]:
    return {"type": "Tuple", "spaces": [space_to_json(s) for s in space.spaces]}


@space_to_json.register
def _(space: gs.Dict) -> dict[str, Any]:
    keys = list(space.spaces.keys())
    return {
        "type": "Dict",
        "keys": keys,
        "spaces": {k: space_to_json(space.spaces[k]) for k in keys},
    }


@space_to_json.register
def _(space: Repeated) -> dict[str, Any]:
    return {
        "type": "Repeated",
        "child_space": space_to_json(space.child_space),
        "max_len": space.max_len,
    }


@space_to_json.register
def _(space: Simplex) -> dict[str, Any]:
    return {
        "type": "Simplex",
        "shape": list(space.shape),
        "concentration": space.concentration.tolist(),
        "dtype": np.dtype(space.dtype).name,
    }


# --------------------------------------------------------------------------- decoding

_Decoder = Callable[[Mapping[str, Any], str], gs.Space]
_DECODERS: dict[str, _Decoder] = {}


def _decoder(type_name: str) -> Callable[[_Decoder], _Decoder]:
    def register(fn: _Decoder) -> _Decoder:
        _DECODERS[type_name] = fn
        return fn

    return register


def _require(node: Mapping[str, Any], key: str, path: str) -> Any:
    if key not in node:
        raise ValueError(f"{path}: {node.get('type', 'space')} needs key '{key}', got keys {sorted(node)}")
    return node[key]


def _float_from_json(value: Any, path: str) -> float:
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("inf", "+inf", "infinity"):
            return math.inf
        if lowered in ("-inf", "-infinity"):
            return -math.inf
        if lowered == "nan":
            return math.nan
        raise ValueError(f"{path}: expected a number or 'inf'/'-inf'/'nan', got {value!r}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{path}: expected a number, got {type(value).__name__} {value!r}")
    return float(value)


def _bound_from_json(value: Any, shape: tuple[int, ...], dtype: np.dtype, path: str) -> np.ndarray:
    def convert(v: Any, p: str) -> Any:
        if isinstance(v, list):
            return [convert(item, f"{p}[{i}]") for i, item in enumerate(v)]
        return _float_from_json(v, p)

    arr = np.asarray(convert(value, path), dtype=np.float64)
    if arr.ndim == 0:
        arr = np.full(shape, float(arr), dtype=np.float64)
    if arr.shape != shape:
        raise ValueError(f"{path}: bound has shape {list(arr.shape)}, expected {list(shape)}")
    if dtype.kind in "iu":
        return arr.astype(dtype)
    return arr.astype(dtype)


def _dtype_from_json(node: Mapping[str, Any], path: str, default: str) -> np.dtype:
    name = node.get("dtype", default)
    try:
        return np.dtype(name)
    except TypeError as exc:
        raise ValueError(f"{path}.dtype: unknown dtype {name!r}") from exc


def _shape_from_json(value: Any, path: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(d, int) and d >= 0 for d in value):
        raise ValueError(f"{path}: expected a list of non-negative integers, got {value!r}")
    return tuple(value)


@_decoder("Box")
def _box(node: Mapping[str, Any], path: str) -> gs.Box:
    shape = _shape_from_json(_require(node, "shape", path), f"{path}.shape")
    dtype = _dtype_from_json(node, path, "float32")
    low = _bound_from_json(_require(node, "low", path), shape, dtype, f"{path}.low")
    high = _bound_from_json(_require(node, "high", path), shape, dtype, f"{path}.high")
    try:
        return gs.Box(low=low, high=high, shape=shape, dtype=dtype)
    except (ValueError, AssertionError) as exc:
        raise ValueError(f"{path}: invalid Box: {exc}") from exc


def _positive_int(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{path}: expected a positive integer, got {value!r}")
    return int(value)


def _int(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{path}: expected an integer, got {value!r}")
    return int(value)


@_decoder("Discrete")
def _discrete(node: Mapping[str, Any], path: str) -> gs.Discrete:
    n = _positive_int(_require(node, "n", path), f"{path}.n")
    start = _int(node.get("start", 0), f"{path}.start")
    return gs.Discrete(n, start=start)


@_decoder("MultiDiscrete")
def _multi_discrete(node: Mapping[str, Any], path: str) -> gs.MultiDiscrete:
    nvec = _require(node, "nvec", path)
    if not isinstance(nvec, list) or not nvec:
        raise ValueError(f"{path}.nvec: expected a non-empty list of positive integers, got {nvec!r}")
    nvec_arr = np.asarray(nvec)
    for i, n in enumerate(nvec_arr.ravel()):
        _positive_int(int(n), f"{path}.nvec[{i}]")
    start = node.get("start")
    start_arr = np.zeros_like(nvec_arr) if start is None else np.asarray(start)
    if start_arr.shape != nvec_arr.shape:
        raise ValueError(f"{path}.start: shape {list(start_arr.shape)} does not match nvec {list(nvec_arr.shape)}")
    dtype = _dtype_from_json(node, path, "int64")
    return gs.MultiDiscrete(nvec_arr.astype(dtype), dtype=dtype, start=start_arr.astype(dtype))


@_decoder("MultiBinary")
def _multi_binary(node: Mapping[str, Any], path: str) -> gs.MultiBinary:
    n = node.get("n", node.get("shape"))
    if n is None:
        raise ValueError(f"{path}: MultiBinary needs 'n' or 'shape'")
    if isinstance(n, list):
        for i, d in enumerate(n):
            _positive_int(d, f"{path}.n[{i}]")
    else:
        _positive_int(n, f"{path}.n")
    return gs.MultiBinary(n)


@_decoder("Tuple")
def _tuple(node: Mapping[str, Any], path: str) -> gs.Tuple:
    children = _require(node, "spaces", path)
    if not isinstance(children, list):
        raise ValueError(f"{path}.spaces: expected a list of spaces, got {type(children).__name__}")
    return gs.Tuple([_decode(child, f"{path}.spaces[{i}]") for i, child in enumerate(children)])


@_decoder("Dict")
def _dict(node: Mapping[str, Any], path: str) -> gs.Dict:
    children = _require(node, "spaces", path)
    if not isinstance(children, Mapping):
        raise ValueError(f"{path}.spaces: expected an object of spaces, got {type(children).__name__}")
    keys = node.get("keys", list(children.keys()))
    if sorted(keys) != sorted(children.keys()):
        raise ValueError(f"{path}.keys: {keys} does not match the keys of 'spaces' {list(children)}")
    # A list of pairs keeps the recorded order (gymnasium would sort a plain dict).
    return gs.Dict([(k, _decode(children[k], f"{path}.spaces.{k}")) for k in keys])


@_decoder("Repeated")
def _repeated(node: Mapping[str, Any], path: str) -> Repeated:
    child = _decode(_require(node, "child_space", path), f"{path}.child_space")
    max_len = _positive_int(_require(node, "max_len", path), f"{path}.max_len")
    return Repeated(child, max_len)


@_decoder("Simplex")
def _simplex(node: Mapping[str, Any], path: str) -> Simplex:
    shape = _shape_from_json(_require(node, "shape", path), f"{path}.shape")
    dtype = _dtype_from_json(node, path, "float32")
    try:
        return Simplex(shape, node.get("concentration"), dtype=dtype)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc


def _decode(node: Any, path: str) -> gs.Space:
    if not isinstance(node, Mapping):
        raise ValueError(f"{path}: expected a space object, got {type(node).__name__} {node!r}")
    type_name = node.get("type")
    decoder = _DECODERS.get(type_name)  # type: ignore[arg-type]
    if decoder is None:
        raise ValueError(
            f"{path}.type: unknown space type {type_name!r}; expected one of {sorted(_DECODERS)}"
        )
    return decoder(node, path)


def space_from_json(node: Any, path: str = "$") -> gs.Space:
    """Decode a space from the oracle's JSON schema.

    Raises ``ValueError`` naming the path of the bad node (``$.spaces.pos.low``).
    """
    return _decode(node, path)


def spaces_equal(a: gs.Space, b: gs.Space) -> bool:
    """Structural equality, by way of the canonical JSON encoding."""
    return space_to_json(a) == space_to_json(b)
