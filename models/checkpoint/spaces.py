"""The spaces of an RLlib policy checkpoint as gymnasium spaces (torch-free).

RLlib (2.x) stores a policy's spaces with ``space_to_dict``: ``{"space": S}`` plus
``"original_space"`` when its preprocessor changed the space, where ``S`` is
``gym_space_to_dict``'s form, ``{"space": "box", "low": <npy>, ...}``, and ``<npy>`` an
array saved with ``np.save``, zlib-compressed and base64-encoded. Older checkpoints pickled
the space objects themselves (``Record``s here). Both forms are read; arrays are loaded
without pickles, and every space is rebuilt through its constructor.

The *raw* environment space is what an export needs (the catalog preprocesses itself), so
``policy_space`` follows ``original_space`` down to the space the environment produced.
"""

from __future__ import annotations

import base64
import binascii
import functools
import io
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from gymnasium import spaces as gs

from rlserve.models.checkpoint.errors import CheckpointError
from rlserve.models.checkpoint.unpickler import Record
from rlserve.models.spaces import Repeated, Simplex

__all__ = ["decode_ndarray", "policy_space", "rllib_space"]

_Builder = Callable[[Mapping[str, Any], str], gs.Space]
_BY_TAG: dict[str, _Builder] = {}


def _tag(*names: str) -> Callable[[_Builder], _Builder]:
    def register(fn: _Builder) -> _Builder:
        for name in names:
            _BY_TAG[name] = fn
        return fn

    return register


def decode_ndarray(value: Any, where: str) -> np.ndarray:
    """RLlib's serialized array (base64 of zlib of ``np.save``), or an array already."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, list | tuple | int | float):
        return np.asarray(value)
    if not isinstance(value, str | bytes):
        raise CheckpointError(f"{where}: expected a serialized numpy array, got {type(value).__name__}")
    try:
        raw = zlib.decompress(base64.b64decode(value, validate=True))
        return np.load(io.BytesIO(raw), allow_pickle=False)
    except (binascii.Error, zlib.error, ValueError, OSError) as exc:
        raise CheckpointError(f"{where}: not a serialized numpy array ({exc})") from None


def _require(node: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in node:
        raise CheckpointError(f"{where}: missing {key!r} (has {sorted(map(str, node))})")
    return node[key]


def _dtype(node: Mapping[str, Any], where: str, default: Any) -> np.dtype:
    value = node.get("dtype", default)
    try:
        return np.dtype(value)
    except TypeError:
        raise CheckpointError(f"{where}.dtype: not a numpy dtype: {value!r}") from None


@_tag("box")
def _box(node: Mapping[str, Any], where: str) -> gs.Space:
    low = decode_ndarray(_require(node, "low", where), f"{where}.low")
    high = decode_ndarray(_require(node, "high", where), f"{where}.high")
    shape = node.get("shape", node.get("_shape"))
    return gs.Box(low, high, None if shape is None else tuple(int(d) for d in shape), _dtype(node, where, low.dtype))


@_tag("discrete")
def _discrete(node: Mapping[str, Any], where: str) -> gs.Space:
    return gs.Discrete(int(_require(node, "n", where)), start=int(node.get("start", 0)))


@_tag("multi-discrete")
def _multi_discrete(node: Mapping[str, Any], where: str) -> gs.Space:
    nvec = decode_ndarray(_require(node, "nvec", where), f"{where}.nvec")
    dtype = _dtype(node, where, np.int64)
    start = node.get("start")
    start_arr = None if start is None else decode_ndarray(start, f"{where}.start").astype(dtype)
    return gs.MultiDiscrete(nvec.astype(dtype), dtype=dtype, start=start_arr)


@_tag("multi-binary")
def _multi_binary(node: Mapping[str, Any], where: str) -> gs.Space:
    n = _require(node, "n", where)
    return gs.MultiBinary([int(d) for d in n] if isinstance(n, list | tuple | np.ndarray) else int(n))


@_tag("tuple")
def _tuple(node: Mapping[str, Any], where: str) -> gs.Space:
    children = _require(node, "spaces", where)
    return gs.Tuple([rllib_space(c, f"{where}.spaces[{i}]") for i, c in enumerate(children)])


@_tag("dict")
def _dict(node: Mapping[str, Any], where: str) -> gs.Space:
    children = _require(node, "spaces", where)
    if not isinstance(children, Mapping):
        raise CheckpointError(f"{where}.spaces: expected a mapping of spaces, got {type(children).__name__}")
    # Pairs keep the stored order, as RLlib restores it (gymnasium would sort a dict).
    return gs.Dict([(str(k), rllib_space(v, f"{where}.spaces.{k}")) for k, v in children.items()])


@_tag("repeated")
def _repeated(node: Mapping[str, Any], where: str) -> gs.Space:
    child = rllib_space(_require(node, "child_space", where), f"{where}.child_space")
    return Repeated(child, int(_require(node, "max_len", where)))


@_tag("simplex")
def _simplex(node: Mapping[str, Any], where: str) -> gs.Space:
    shape = node.get("shape", node.get("_shape"))
    concentration = node.get("concentration")
    if concentration is not None:
        concentration = decode_ndarray(concentration, f"{where}.concentration")
    return Simplex(tuple(int(d) for d in _require({"shape": shape}, "shape", where)), concentration,
                   dtype=_dtype(node, where, np.float32))


# Pickled space objects: class name -> the tag of the same constructor.
_RECORD_TAGS = {
    "Box": "box", "Discrete": "discrete", "MultiDiscrete": "multi-discrete", "MultiBinary": "multi-binary",
    "Tuple": "tuple", "Dict": "dict", "Repeated": "repeated", "Simplex": "simplex",
}


def _record_fields(record: Record, where: str) -> tuple[str, dict[str, Any]]:
    name = record.qualname.rpartition(".")[2]
    if name not in _RECORD_TAGS:
        raise CheckpointError(f"{where}: {record.qualname} is not a supported space")
    fields = dict(record.fields)
    if name == "Dict" and isinstance(fields.get("spaces"), Mapping):
        fields["spaces"] = dict(fields["spaces"])
    return _RECORD_TAGS[name], fields


@functools.singledispatch
def rllib_space(node: Any, where: str = "space") -> gs.Space:
    """One space in RLlib's ``gym_space_to_dict`` form or as a pickled space object."""
    raise CheckpointError(f"{where}: expected a space, got {type(node).__name__}")


@rllib_space.register
def _(node: Record, where: str = "space") -> gs.Space:
    tag, fields = _record_fields(node, where)
    return _build(tag, fields, where)


@rllib_space.register(Mapping)
def _(node: Mapping[str, Any], where: str = "space") -> gs.Space:
    return _build(node.get("space"), node, where)


def _build(tag: Any, node: Mapping[str, Any], where: str) -> gs.Space:
    if tag not in _BY_TAG:
        raise CheckpointError(f"{where}: space type {tag!r} is not supported (supported: {sorted(_BY_TAG)})")
    try:
        return _BY_TAG[tag](node, where)
    except CheckpointError:
        raise
    except (TypeError, ValueError, AssertionError) as exc:
        raise CheckpointError(f"{where}: invalid {tag} space: {exc}") from None


def policy_space(node: Any, where: str) -> gs.Space:
    """The raw environment space of a policy spec's ``observation_space``/``action_space``:
    ``space_to_dict``'s wrapper (following ``original_space``), a bare space dict, or a
    pickled space object (following its ``original_space`` attribute)."""
    if isinstance(node, Mapping) and isinstance(node.get("space"), Mapping | Record):
        if node.get("original_space") is not None:
            return policy_space(node["original_space"], f"{where}.original_space")
        return rllib_space(node["space"], f"{where}.space")
    if isinstance(node, Record) and node.fields.get("original_space") is not None:
        return policy_space(node.fields["original_space"], f"{where}.original_space")
    if node is None:
        raise CheckpointError(f"{where}: no space stored")
    return rllib_space(node, where)
