"""RLlib's default ``conv_filters`` by image size (``ray.rllib.models.utils.get_filter_config``).

The old stack's ``VisionNetwork`` (``models/networks/visionnet.py``) and the new stack's
``CNNEncoder`` (``models/rlmodules/encoders.py``) take these when a model config leaves
``conv_filters`` unset. Torch-free: one table, one lookup, and every answer a copy of its
own (a caller may edit the lists it gets without changing the next model's defaults).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

# ray 2.60's table, by (H, W); 64x64's ends in a 3x3 map, which VisionNetwork rejects on use.
_DEFAULT_FILTERS: dict[tuple[int, int], list[list[Any]]] = {
    (96, 96): [[16, [8, 8], 4], [32, [4, 4], 2], [256, [11, 11], 2]],
    (84, 84): [[16, [8, 8], 4], [32, [4, 4], 2], [256, [11, 11], 1]],
    (64, 64): [[16, [4, 4], 2], [32, [4, 4], 2], [64, [4, 4], 2], [128, [4, 4], 2]],
    (42, 42): [[16, [4, 4], 2], [32, [4, 4], 2], [256, [11, 11], 1]],
    (10, 10): [[16, [5, 5], 2], [32, [5, 5], 2]],
}


def default_conv_filters(shape: Sequence[int]) -> list[list[Any]]:
    """A copy of RLlib's default ``conv_filters`` for an image of ``shape``: (H, W, C), or
    (C, H, W) as RLlib also matches (H, W first, then the last two axes); ValueError when
    RLlib has none for it."""
    dims = [int(d) for d in shape]
    if len(dims) in (2, 3):
        for size, filters in _DEFAULT_FILTERS.items():
            if tuple(dims[:2]) == size or tuple(dims[1:]) == size:
                return copy.deepcopy(filters)
    known = ", ".join(f"[{h}, {w}, K]" for h, w in _DEFAULT_FILTERS)
    raise ValueError(f"conv_filters: no default for observation shape {dims}; defaults exist only for {known}. "
                     "Set model_config['conv_filters'] to a list of [out_channels, [kh, kw], stride]")
