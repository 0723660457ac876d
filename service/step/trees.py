"""Row operations on batched action structures: arrays, tuples and dicts of arrays.

Distributions return actions in the action space's structure with a leading batch axis
(B, ...) on every leaf. The batch step needs to select rows, slice per request and splice
single-row samples in; these helpers do that for any nesting.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def tree_map(fn: Callable[..., Any], tree: Any, *rest: Any) -> Any:
    if isinstance(tree, tuple | list):
        return type(tree)(tree_map(fn, t, *(r[i] for r in rest)) for i, t in enumerate(tree))
    if isinstance(tree, dict):
        return {k: tree_map(fn, v, *(r[k] for r in rest)) for k, v in tree.items()}
    return fn(tree, *rest)


def tree_slice(tree: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of every leaf."""
    return tree_map(lambda leaf: leaf[start:stop], tree)



def tree_where(rows: np.ndarray, yes: Any, no: Any) -> Any:
    """Row-wise choice: ``yes`` where ``rows`` (B,) is true, else ``no``."""

    def pick(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        cond = rows.reshape((-1,) + (1,) * (np.ndim(a) - 1))
        return np.where(cond, a, b)

    return tree_map(pick, yes, no)


def explore_where(dist: Any, explore: np.ndarray, rng: np.random.Generator) -> Any:
    """A distribution's actions for a batch of rows in two modes: its sample (drawn with
    ``rng``) where ``explore`` (B,) is true, its mode elsewhere; only what is needed is drawn."""
    if explore.all():
        return dist.sample(rng)
    if not explore.any():
        return dist.deterministic_sample()
    return tree_where(explore, dist.sample(rng), dist.deterministic_sample())


def tree_set_row(tree: Any, row: int, value: Any) -> None:
    """Write a one-row structure ``value`` into row ``row`` of ``tree`` in place."""

    def put(leaf: np.ndarray, single: np.ndarray) -> None:
        leaf[row] = np.asarray(single)[0]

    tree_map(put, tree, value)
