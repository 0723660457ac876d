"""Action masking on categorical dist inputs (RLlib's action-mask example, in numpy).

RLlib's example model adds ``clamp(log(mask), min=FLOAT_MIN)`` to the logits, with
``FLOAT_MIN = -3.4e38``: a masked logit becomes a finite -3.4e38 (not -inf), so the
masked action's probability is exactly 0 (never sampled) while logp and entropy stay
finite. We do the same, in float32.

Which dist inputs are categorical comes from the :class:`ActionDistSpec`:

* Categorical: mask ``(B, n)``;
* MultiCategorical (MultiDiscrete / integer Box): ``(B, sum(n_i))`` concatenated, or a
  list with one ``(B, n_i)`` array per component;
* MultiActionDistribution (Tuple/Dict): either the action space's structure (a tuple or
  dict whose categorical leaves hold masks as above and whose other leaves hold None or,
  for a Dict, are left out), or one flat ``(B, total)`` array of all categorical
  components concatenated in flattened order (Tuple order, Dict keys sorted).

Errors: a shape mismatch is a ValueError naming the component, expected and received
shapes; a row whose mask allows nothing in some component is a :class:`MaskError`
naming the row and the component (sampling from it is undefined).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .catalog import ActionDistSpec, _cached_space
from .categorical import Categorical, MultiCategorical
from .epsilon_greedy import EpsilonGreedyQ
from .multi import MultiActionDistribution
from .structure import leaf_paths, path_str

__all__ = ["FLOAT_MIN", "MaskError", "apply_action_mask", "mask_components"]

FLOAT_MIN = np.float32(-3.4e38)


class MaskError(ValueError):
    """A mask row allows no action in some categorical component."""


@dataclass(frozen=True)
class MaskComponent:
    """One categorical block of the dist inputs: columns ``[offset, offset + n)``."""

    label: str
    offset: int
    n: int


def _components_of(spec: ActionDistSpec, offset: int, label: str) -> list[MaskComponent]:
    if spec.custom:
        raise ValueError(f"action masking does not know the layout of custom distribution {spec.name!r}")
    if spec.name in (Categorical.rllib_name, EpsilonGreedyQ.rllib_name):  # Q-values mask like logits
        return [MaskComponent(label or "action", offset, spec.num_outputs)]
    if spec.name == MultiCategorical.rllib_name:
        out, pos = [], offset
        for i, n in enumerate(spec.kwargs["input_lens"]):
            out.append(MaskComponent(f"{label}[{i}]" if label else f"component {i}", pos, int(n)))
            pos += int(n)
        return out
    return []


def mask_components(spec: ActionDistSpec) -> list[list[MaskComponent]]:
    """Categorical blocks grouped per action leaf (one group for a non-composite space)."""
    if spec.name != MultiActionDistribution.rllib_name or spec.custom:
        comps = _components_of(spec, 0, "")
        if not comps:
            raise ValueError(f"action masking needs categorical logits; {spec.name} has none")
        return [comps]
    paths = leaf_paths(_cached_space(spec.kwargs["action_space"]))
    groups, offset = [], 0
    for path, child in zip(paths, spec.children, strict=True):
        groups.append(_components_of(child, offset, f"leaf '{path_str(path)}'"))
        offset += child.num_outputs
    if not any(groups):
        raise ValueError("action masking needs a Discrete/MultiDiscrete leaf; this action space has none")
    return groups


def _split_group(mask: Any, comps: list[MaskComponent], batch: int) -> list[np.ndarray]:
    """One group's mask -> one (B, n) array per component."""
    if isinstance(mask, list | tuple) and len(comps) > 1:
        if len(mask) != len(comps):
            raise ValueError(f"mask for {comps[0].label}: expected {len(comps)} component masks, got {len(mask)}")
        parts = [np.asarray(m) for m in mask]
    else:
        arr = np.asarray(mask)
        total = sum(c.n for c in comps)
        if arr.shape != (batch, total):
            raise ValueError(
                f"mask for {comps[0].label.split('[')[0]}: expected shape ({batch}, {total}), got {arr.shape}"
            )
        parts = np.split(arr, np.cumsum([c.n for c in comps])[:-1], axis=1)
    for comp, part in zip(comps, parts, strict=True):
        if part.shape != (batch, comp.n):
            raise ValueError(f"mask for {comp.label}: expected shape ({batch}, {comp.n}), got {part.shape}")
    return parts


def _structured_groups(mask: Any, spec: ActionDistSpec) -> list[Any]:
    """A Tuple/Dict-structured mask -> one entry per action leaf (None for no mask)."""
    space = _cached_space(spec.kwargs["action_space"])
    out = []
    for path in leaf_paths(space):
        node: Any = mask
        for key in path:
            if isinstance(node, Mapping):
                node = node.get(key)
            elif isinstance(node, Sequence) and not isinstance(node, str) and isinstance(key, int) and key < len(node):
                node = node[key]
            else:
                raise ValueError(
                    f"mask: expected the action space's structure at '{path_str(path)}', got {type(node).__name__}"
                )
            if node is None:
                break
        out.append(node)
    return out


def _per_component(mask: Any, spec: ActionDistSpec, batch: int) -> list[tuple[MaskComponent, np.ndarray]]:
    groups = mask_components(spec)
    flat = [c for g in groups for c in g]
    is_multi = spec.name == MultiActionDistribution.rllib_name
    if is_multi and isinstance(mask, Mapping | list | tuple):
        leaves = _structured_groups(mask, spec)
        pairs: list[tuple[MaskComponent, np.ndarray]] = []
        for comps, leaf_mask in zip(groups, leaves, strict=True):
            if leaf_mask is None:
                continue
            if not comps:
                raise ValueError("mask given for a non-categorical action leaf; use None there")
            pairs.extend(zip(comps, _split_group(leaf_mask, comps, batch), strict=True))
        return pairs
    if is_multi:
        return list(zip(flat, _split_group(mask, flat, batch), strict=True))
    return list(zip(groups[0], _split_group(mask, groups[0], batch), strict=True))


def apply_action_mask(dist_inputs: np.ndarray, mask: Any, spec: ActionDistSpec) -> np.ndarray:
    """``dist_inputs`` with ``max(log(mask), -3.4e38)`` added to the masked logits.

    ``mask`` holds 1 (allowed) / 0 (forbidden) per action (bool or numbers >= 0; RLlib's
    formula also accepts weights). Returns a new float32 ``(B, N)`` array.
    """
    logits = np.array(dist_inputs, dtype=np.float32, copy=True)
    if logits.ndim != 2 or logits.shape[1] != spec.num_outputs:
        raise ValueError(f"dist inputs: expected shape (B, {spec.num_outputs}), got {logits.shape}")
    batch = logits.shape[0]
    for comp, part in _per_component(mask, spec, batch):
        m = np.asarray(part, dtype=np.float32)
        if not np.all(np.isfinite(m)) or np.any(m < 0):
            raise ValueError(f"mask for {comp.label}: values must be finite and >= 0 (1 = allowed, 0 = masked)")
        empty = ~np.any(m > 0, axis=1)
        if empty.any():
            rows = np.flatnonzero(empty).tolist()
            raise MaskError(f"mask for {comp.label} allows no action in rows {rows}")
        with np.errstate(divide="ignore"):
            add = np.maximum(np.log(m), FLOAT_MIN)
        block = slice(comp.offset, comp.offset + comp.n)
        with np.errstate(over="ignore"):
            logits[:, block] = (logits[:, block] + add).astype(np.float32)
    return logits
