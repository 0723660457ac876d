"""What a traced module's batch holds, as the flat tensors of the uniform contract (torch).

``StateLayout``: the module's ``get_initial_state()`` (any nest of dicts, lists, arrays) as
the session's state tensors, one per leaf in a fixed order (dict keys sorted), each
``(B, *leaf shape)``; ``nest`` rebuilds the module's ``state_in``, ``flatten`` its ``state_out``.
A leaf whose initial value is not one number everywhere is kept as its difference from
that value, so a session still starts from zeros (the server's episode start).

``ObsLayout``: a Dict/Tuple observation that the module reads itself. The server sends it as
one float row, the leaves in ``FlattenObservations``' order (``models/connectors/flatten.py``);
``unflatten`` cuts the row back into the structure: Box and MultiBinary leaves reshaped,
Discrete and MultiDiscrete leaves (one-hot in the row) back to their integers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces as gs

from rlserve.models.connectors.flatten import flat_size

__all__ = ["ObsLayout", "StateLayout"]

Path = tuple[Any, ...]


def _leaves(nest: Any, path: Path = ()) -> list[tuple[Path, Any]]:
    if isinstance(nest, dict):
        return [leaf for key in sorted(nest) for leaf in _leaves(nest[key], (*path, key))]
    if isinstance(nest, list | tuple):
        return [leaf for i, item in enumerate(nest) for leaf in _leaves(item, (*path, i))]
    return [(path, nest)]


def _nest(template: Any, values: dict[Path, Any], path: Path = ()) -> Any:
    if isinstance(template, dict):
        return {key: _nest(template[key], values, (*path, key)) for key in template}
    if isinstance(template, list | tuple):
        return type(template)(_nest(item, values, (*path, i)) for i, item in enumerate(template))
    return values[path]


def _numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


@dataclass
class StateLayout:
    template: Any  # the initial state's nest (leaves replaced by their paths' values on use)
    paths: list[Path]
    shapes: list[tuple[int, ...]]
    initial: list[np.ndarray]  # float32, per leaf
    fills: list[float | None]  # one number everywhere (the session's initial value), or None

    @classmethod
    def of(cls, initial_state: Any) -> StateLayout:
        leaves = _leaves(initial_state) if initial_state not in (None, {}) else []
        arrays = [_numpy(v).astype(np.float32) for _, v in leaves]
        fills = [float(a.flat[0]) if a.size and np.all(a == a.flat[0]) else None for a in arrays]
        return cls(initial_state, [p for p, _ in leaves], [tuple(int(d) for d in a.shape) for a in arrays],
                   arrays, fills)

    def __len__(self) -> int:
        return len(self.paths)

    def name(self, i: int) -> str:
        return "/".join(str(p) for p in self.paths[i]) or "state"

    def offsets(self) -> list[torch.Tensor | None]:
        """Per leaf: the initial state the graph adds to what the session keeps (None: none)."""
        return [None if fill is not None else torch.from_numpy(a) for a, fill in zip(self.initial, self.fills,
                                                                                      strict=True)]

    def nest(self, tensors: Sequence[torch.Tensor]) -> Any:
        return _nest(self.template, dict(zip(self.paths, tensors, strict=True)))

    def flatten(self, state_out: Any) -> list[torch.Tensor]:
        found = dict(_leaves(state_out))
        missing = [self.name(i) for i, p in enumerate(self.paths) if p not in found]
        if missing or len(found) != len(self.paths):
            raise ValueError(f"state_out holds {sorted('/'.join(map(str, p)) for p in found)}, but "
                             f"get_initial_state() holds {[self.name(i) for i in range(len(self))]}")
        return [found[p] for p in self.paths]


@dataclass
class ObsLayout:
    space: gs.Space

    @property
    def width(self) -> int:
        return flat_size(self.space)

    def unflatten(self, row: torch.Tensor) -> Any:
        out, stop = self._cut(self.space, row, 0)
        if stop != row.shape[-1]:
            raise ValueError(f"the observation row has {row.shape[-1]} values; {self.space} flattens to {stop}")
        return out

    def _cut(self, space: gs.Space, row: torch.Tensor, start: int) -> tuple[Any, int]:
        if isinstance(space, gs.Dict):  # sorted keys in the row; the module gets the space's own order
            parts = {}
            for key in sorted(space.spaces):
                parts[key], start = self._cut(space.spaces[key], row, start)
            return {key: parts[key] for key in space.spaces}, start
        if isinstance(space, gs.Tuple):
            items = []
            for sub in space.spaces:
                item, start = self._cut(sub, row, start)
                items.append(item)
            return tuple(items), start
        stop = start + flat_size(space)
        block = row[:, start:stop]
        if isinstance(space, gs.Discrete):
            return torch.argmax(block, dim=-1) + int(space.start), stop
        if isinstance(space, gs.MultiDiscrete):
            edges = np.cumsum([0, *np.ravel(space.nvec).tolist()])
            picks = [torch.argmax(block[:, a:b], dim=-1) for a, b in zip(edges[:-1], edges[1:], strict=True)]
            return torch.stack(picks, dim=-1).reshape(-1, *space.shape), stop
        if isinstance(space, gs.Box | gs.MultiBinary):
            return block.reshape(-1, *space.shape), stop
        raise ValueError(f"{type(space).__name__} observation leaves cannot be rebuilt from a flat row")
