"""Leaves of Tuple/Dict action spaces in RLlib's flattened order (torch-free).

RLlib flattens a composite action space with ``flatten_space`` and composite action
values with ``tree.flatten``; both walk Tuple children in order and Dict children in
**sorted key** order, recursively. Child distributions, their input slices and the flat
action row all follow that order, so every helper here uses it too. Rebuilt values use the
space's own structure (a tuple for Tuple, a dict in the space's key order for Dict).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from gymnasium import spaces as gs

__all__ = ["Path", "flatten_leaves", "leaf_spaces", "leaf_paths", "unflatten_leaves", "path_str"]

Path = tuple[Any, ...]


@functools.singledispatch
def _walk(space: gs.Space, path: Path, out: list[tuple[Path, gs.Space]]) -> None:
    out.append((path, space))


@_walk.register
def _(space: gs.Tuple, path: Path, out: list[tuple[Path, gs.Space]]) -> None:
    for i, child in enumerate(space.spaces):
        _walk(child, (*path, i), out)


@_walk.register
def _(space: gs.Dict, path: Path, out: list[tuple[Path, gs.Space]]) -> None:
    for key in sorted(space.spaces):
        _walk(space.spaces[key], (*path, key), out)


def _leaves(space: gs.Space) -> list[tuple[Path, gs.Space]]:
    out: list[tuple[Path, gs.Space]] = []
    _walk(space, (), out)
    return out


def leaf_spaces(space: gs.Space) -> list[gs.Space]:
    """The non-composite sub-spaces in flattened order (a simple space is its own leaf)."""
    return [s for _, s in _leaves(space)]


def leaf_paths(space: gs.Space) -> list[Path]:
    """Paths (Tuple indices / Dict keys) of the leaves, in flattened order."""
    return [p for p, _ in _leaves(space)]


def path_str(path: Path) -> str:
    """``(1, 'pos')`` -> ``'1/pos'``; the root leaf is ``''`` (the fixture's path scheme)."""
    return "/".join(str(p) for p in path)


def _get(value: Any, key: Any, path: Path) -> Any:
    if isinstance(key, int):
        if not isinstance(value, Sequence) or isinstance(value, str | bytes):
            raise ValueError(f"action at '{path_str(path)}': expected a tuple/list, got {type(value).__name__}")
        if key >= len(value):
            raise ValueError(f"action at '{path_str(path)}': expected index {key}, got {len(value)} items")
        return value[key]
    if not isinstance(value, Mapping):
        raise ValueError(f"action at '{path_str(path)}': expected a dict, got {type(value).__name__}")
    if key not in value:
        raise ValueError(f"action at '{path_str(path)}': missing key {key!r}, got keys {sorted(value)}")
    return value[key]


def flatten_leaves(space: gs.Space, value: Any) -> list[Any]:
    """The leaf values of a structured ``value`` in flattened order."""
    out = []
    for path, _ in _leaves(space):
        node = value
        for depth, key in enumerate(path):
            node = _get(node, key, path[:depth])
        out.append(node)
    return out


@functools.singledispatch
def _build(space: gs.Space, leaves: list[Any], pos: list[int]) -> Any:
    value = leaves[pos[0]]
    pos[0] += 1
    return value


@_build.register
def _(space: gs.Tuple, leaves: list[Any], pos: list[int]) -> Any:
    return tuple(_build(child, leaves, pos) for child in space.spaces)


@_build.register
def _(space: gs.Dict, leaves: list[Any], pos: list[int]) -> Any:
    # Consume in sorted order (the flattened order), then present in the space's order.
    built = {key: _build(space.spaces[key], leaves, pos) for key in sorted(space.spaces)}
    return {key: built[key] for key in space.spaces}


def unflatten_leaves(space: gs.Space, leaves: Sequence[Any]) -> Any:
    """Inverse of :func:`flatten_leaves`: tuples for Tuple, dicts (space key order) for Dict."""
    expected = len(_leaves(space))
    if len(leaves) != expected:
        raise ValueError(f"expected {expected} leaves for {space}, got {len(leaves)}")
    return _build(space, list(leaves), [0])
