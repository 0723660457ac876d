"""A shared catalog of observation spaces for property tests (hypothesis strategies),
plus an independent sampler and an independent columnar encoder (the io.npz ``obs/...``
layout) so preprocessor tests do not reuse the code under test to build their inputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces as gs
from hypothesis import strategies as st

from rlserve.models.spaces import Repeated, Simplex

_FLOAT = [np.float32, np.float64]
_INT = [np.int64, np.int32, np.uint8]
_shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple)


@st.composite
def boxes(draw) -> gs.Box:
    shape = draw(_shapes)
    if draw(st.booleans()):
        dtype = draw(st.sampled_from(_FLOAT))
        lo = draw(st.sampled_from([-np.inf, -10.0, -1.0, 0.0, -0.5]))
        hi = draw(st.sampled_from([np.inf, 10.0, 1.0, 0.5]))
        if draw(st.booleans()) and shape:  # per-element bounds
            low = np.full(shape, lo)
            low.flat[0] = -2.0
            return gs.Box(low=low.astype(dtype), high=np.full(shape, hi, dtype=dtype), dtype=dtype)
        return gs.Box(lo, hi, shape=shape, dtype=dtype)
    dtype = draw(st.sampled_from(_INT))
    lo = draw(st.integers(0, 3)) if dtype == np.uint8 else draw(st.integers(-5, 3))
    return gs.Box(lo, lo + draw(st.integers(0, 9)), shape=shape, dtype=dtype)


@st.composite
def discretes(draw) -> gs.Discrete:
    return gs.Discrete(draw(st.integers(1, 6)), start=draw(st.integers(-3, 3)))


@st.composite
def multi_discretes(draw) -> gs.MultiDiscrete:
    nvec = np.array(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
    if draw(st.booleans()) and len(nvec) % 2 == 0:
        nvec = nvec.reshape(2, -1)  # gymnasium allows a multi-axis nvec
    start = np.array(draw(st.lists(st.integers(-2, 2), min_size=nvec.size, max_size=nvec.size))).reshape(nvec.shape)
    return gs.MultiDiscrete(nvec, start=start)


@st.composite
def multi_binaries(draw) -> gs.MultiBinary:
    return gs.MultiBinary(draw(st.one_of(st.integers(1, 5), st.lists(st.integers(1, 3), min_size=1, max_size=2))))


@st.composite
def simplexes(draw) -> Simplex:
    k = draw(st.integers(2, 4))
    shape = (k,) if draw(st.booleans()) else (draw(st.integers(1, 3)), k)
    conc = draw(st.lists(st.floats(0.1, 5.0), min_size=k, max_size=k))
    return Simplex(shape, conc)


leaf_spaces = st.one_of(boxes(), discretes(), multi_discretes(), multi_binaries(), simplexes())

_keys = st.lists(st.text("abcdefgxyz_", min_size=1, max_size=4), min_size=1, max_size=4, unique=True)


def _containers(children):
    tuples = st.lists(children, min_size=1, max_size=3).map(gs.Tuple)
    # Pairs keep the drawn (unsorted) order: the catalog must not assume sorted keys.
    dicts = _keys.flatmap(lambda ks: st.lists(children, min_size=len(ks), max_size=len(ks)).map(
        lambda ss: gs.Dict(list(zip(ks, ss, strict=True)))))
    repeated = st.tuples(children, st.integers(1, 4)).map(lambda a: Repeated(a[0], a[1]))
    return st.one_of(tuples, dicts, repeated)


spaces = st.recursive(leaf_spaces, _containers, max_leaves=6)


# --------------------------------------------------------------------------- values

def sample(space: gs.Space, rng: np.random.Generator) -> Any:
    """One observation as gymnasium produces it (Repeated lists may be empty)."""
    if isinstance(space, Repeated):
        return [sample(space.child_space, rng) for _ in range(int(rng.integers(0, space.max_len + 1)))]
    if isinstance(space, gs.Tuple):
        return tuple(sample(s, rng) for s in space.spaces)
    if isinstance(space, gs.Dict):
        return {k: sample(s, rng) for k, s in space.spaces.items()}
    space.seed(int(rng.integers(2**31)))
    return space.sample()


def to_columns(space: gs.Space, rows: list[Any], key: str = "") -> dict[str, np.ndarray]:
    """Rows -> the io.npz layout ``{path: (N, ...)}`` (Repeated: ``__len__`` + padded ``__items__``)."""
    def join(part: str) -> str:
        return part if key == "" else f"{key}/{part}"

    if isinstance(space, gs.Tuple):
        out: dict[str, np.ndarray] = {}
        for i, s in enumerate(space.spaces):
            out.update(to_columns(s, [r[i] for r in rows], join(str(i))))
        return out
    if isinstance(space, gs.Dict):
        out = {}
        for k, s in space.spaces.items():
            out.update(to_columns(s, [r[k] for r in rows], join(k)))
        return out
    if isinstance(space, Repeated):
        out = {join("__len__"): np.array([len(r) for r in rows], dtype=np.int64)}
        template = to_columns(space.child_space, [], join("__items__"))  # dtypes and shapes
        for k, t in template.items():
            out[k] = np.zeros((len(rows), space.max_len, *t.shape[1:]), dtype=t.dtype)
        for n, r in enumerate(rows):
            if r:
                cols = to_columns(space.child_space, list(r), join("__items__"))
                for k, v in cols.items():
                    out[k][n, : len(r)] = v
        return out
    dtype = np.int64 if isinstance(space, gs.Discrete) else space.dtype
    return {key: np.asarray(rows, dtype=dtype).reshape((len(rows), *(space.shape or ())))}


def row_from_columns(space: gs.Space, cols: dict[str, np.ndarray], index: tuple[int, ...], key: str = "") -> Any:
    """The structured observation at ``index`` (leading axes) of io.npz-style columns."""
    def join(part: str) -> str:
        return part if key == "" else f"{key}/{part}"

    if isinstance(space, gs.Tuple):
        return tuple(row_from_columns(s, cols, index, join(str(i))) for i, s in enumerate(space.spaces))
    if isinstance(space, gs.Dict):
        return {k: row_from_columns(s, cols, index, join(k)) for k, s in space.spaces.items()}
    if isinstance(space, Repeated):
        length = int(cols[join("__len__")][index])
        items_key = join("__items__")
        sub = {k: v[index] for k, v in cols.items() if k == items_key or k.startswith(items_key + "/")}
        return [row_from_columns(space.child_space, sub, (j,), items_key) for j in range(length)]
    value = cols[key][index]
    return int(value) if isinstance(space, gs.Discrete) else value
