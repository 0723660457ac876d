"""Action masks: validated before a request is queued, applied to the dist inputs.

A mask row is one flat list of 0/1 over every categorical block of the dist inputs in
flattened action order (Discrete: n values; MultiDiscrete: sum(nvec); Tuple/Dict: the
categorical leaves concatenated), the layout of
``rlserve.models.distributions.masking.mask_components``.

RLlib's convention adds ``max(log(mask), FLOAT_MIN)`` to the logits. For a 0/1 mask that
equals replacing masked logits by ``FLOAT_MIN`` (any logit is far below FLOAT_MIN's
rounding step), and replacing is idempotent: a model that already masks in its graph,
fed the same mask through its ``action_mask`` observation, is not masked twice into
``-inf`` (which would turn the entropy into NaN).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlserve.models.distributions import ActionDistSpec
from rlserve.models.distributions.masking import FLOAT_MIN, mask_components
from rlserve.service.errors import AllActionsMasked, InvalidInput


@dataclass(frozen=True)
class MaskLayout:
    """Where mask columns land in the dist inputs, and the blocks that need one 1 each."""

    columns: np.ndarray  # (W,) dist-input column of each mask column
    blocks: list[tuple[str, int, int]]  # (label, start, stop) in mask columns

    @property
    def width(self) -> int:
        return int(self.columns.size)


def mask_layout(spec: ActionDistSpec) -> MaskLayout | None:
    """The mask layout of ``spec``, or None when it has no categorical logits."""
    try:
        groups = mask_components(spec)
    except ValueError:
        return None
    comps = [c for group in groups for c in group]
    columns = np.concatenate([np.arange(c.offset, c.offset + c.n) for c in comps])
    blocks, start = [], 0
    for comp in comps:
        blocks.append((comp.label, start, start + comp.n))
        start += comp.n
    return MaskLayout(columns.astype(np.int64), blocks)


def validate_mask(value: Any, layout: MaskLayout | None, field: str) -> np.ndarray:
    """One row's mask as a (W,) bool array; 422 if malformed or a block is all masked."""
    if layout is None:
        raise InvalidInput(
            f"{field}: this model's actions have no categorical part to mask",
            field=field,
            expected="no action mask",
            received="a mask",
        )
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):
        arr = None
    if arr is not None and arr.dtype.kind not in "biuf":  # strings like "1" are not a mask
        arr = None
    if arr is None or arr.shape != (layout.width,) or not np.all((arr == 0) | (arr == 1)):
        raise InvalidInput(
            f"{field}: expected {layout.width} values, each 0 or 1",
            field=field,
            expected=f"list of {layout.width} zeros/ones",
            received=_describe(value),
        )
    mask = arr.astype(bool)
    for label, start, stop in layout.blocks:
        if not mask[start:stop].any():
            which = "every action" if len(layout.blocks) == 1 else f"every choice of {label}"
            raise AllActionsMasked(
                f"{field}: the mask excludes {which}; at least one must be allowed",
                field=field,
                expected="at least one 1 per categorical action",
                received=mask[start:stop].astype(int).tolist(),
            )
    return mask


def apply_mask(dist_inputs: np.ndarray, mask: np.ndarray, layout: MaskLayout) -> np.ndarray:
    """``dist_inputs`` (B, N) with masked logits set to FLOAT_MIN; ``mask`` (B, W) bool."""
    out = np.array(dist_inputs, dtype=np.float32, copy=True)
    cols = layout.columns
    out[:, cols] = np.where(mask, out[:, cols], FLOAT_MIN)
    return out


def _describe(value: Any) -> Any:
    if isinstance(value, list):
        return f"list of length {len(value)}" if len(value) > 20 else value
    return value
