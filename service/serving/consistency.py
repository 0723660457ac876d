"""Load-time check that a bundle's manifest and its model agree (torch-free).

The manifest says what the server feeds the model and how it reads the answer: the
observation's shape (``signature.obs_shape``), the state and previous-action inputs, and
the action distribution whose dist inputs the model outputs (``action_dist``, for the
``action_space``). The reference check alone cannot see a manifest that disagrees with its
model: it feeds the reference's own arrays to the runtime. A bundle whose manifest says
``obs_shape [5]`` for a graph that takes 4 columns, or ``Discrete(3)`` for a model with 2
dist inputs, would load and then fail every valid request with a 500. ``check_consistency``
refuses it at load instead, naming what disagrees, from:

- sizes: ``num_outputs`` and every shape's dims are positive and bounded;
- the runtime's declared input and output shapes (ONNX; symbolic dims, the batch dim
  among them, are skipped) against the signature;
- the reference inputs' and outputs' shapes against the signature;
- the action distribution against the action space: the catalog's width for that
  distribution class and space (``models/distributions/catalog.py``, RLlib's rule).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlserve.models.distributions.catalog import ActionDistSpec, UnsupportedActionSpaceError, get_action_dist
from rlserve.models.distributions.registry import builtin_dist_class
from rlserve.models.export.errors import BundleError
from rlserve.models.export.manifest import Manifest
from rlserve.models.interface import ModelSignature

MAX_WIDTH = 1 << 20  # dist inputs per row
MAX_ELEMENTS = 1 << 28  # elements of one row of any input (a 16k x 16k image)

Shapes = Mapping[str, Sequence[Any]]


def check_consistency(manifest: Manifest, declared: Shapes, runtime_file: str = "the model file",
                      reference: tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]] | None = None) -> None:
    """Raise ``BundleError`` naming the first disagreement between ``manifest``, the
    runtime's ``declared`` shapes (input/output name -> dims with the batch first, symbolic
    dims as str or None; read from ``runtime_file``) and the ``reference`` (inputs, outputs)
    arrays, when given."""
    sig = manifest.signature
    _check_sizes(manifest, sig)
    expected = _row_shapes(sig)
    width = int(manifest.action_dist.get("num_outputs", sig.num_outputs))
    for name, dims in declared.items():
        want = expected.get(name) if name != "dist_inputs" else (width,)
        if want is not None:
            what = f"the model's input {name!r}" if name != "dist_inputs" else "the model's output 'dist_inputs'"
            _compare(f"{what} ({runtime_file})", name, list(dims)[1:], want)
    if reference is not None:
        inputs, outputs = reference
        ref_file = manifest.reference.get("file")
        for name, array in inputs.items():
            if name in expected:
                _compare(f"reference input {name!r} ({ref_file})", name, array.shape[1:], expected[name])
        rows = {name: array.shape[0] if array.ndim else None for name, array in inputs.items()}
        if len(set(rows.values())) > 1:
            raise BundleError(f"{ref_file}: the reference inputs' rows disagree: {rows}")
        if "dist_inputs" in outputs:
            _compare(f"reference output 'dist_inputs' ({ref_file})", "dist_inputs", outputs["dist_inputs"].shape[1:],
                     (width,))
    _check_action_dist(manifest, sig)


def _check_sizes(manifest: Manifest, sig: ModelSignature) -> None:
    widths = {"num_outputs": manifest.num_outputs, "action_dist.num_outputs": manifest.action_dist.get("num_outputs")}
    for what, value in widths.items():
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_WIDTH:
            raise BundleError(f"manifest.json: {what} is {value!r}; expected an integer from 1 to {MAX_WIDTH}")
    shapes = {"signature.obs_shape": sig.obs_shape, **{f"signature.state[{i}].shape": s.shape
                                                        for i, s in enumerate(sig.state)}}
    for what, shape in shapes.items():
        dims_ok = all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape)
        if not dims_ok or int(np.prod(shape, dtype=np.float64)) > MAX_ELEMENTS:
            raise BundleError(f"manifest.json: {what} is {list(shape)}; expected positive dims of at most "
                              f"{MAX_ELEMENTS} elements in all")
    if not 0 <= sig.prev.action_width <= MAX_WIDTH:
        raise BundleError(f"manifest.json: signature.prev.action_width is {sig.prev.action_width}; expected 0 to "
                          f"{MAX_WIDTH}")


def _row_shapes(sig: ModelSignature) -> dict[str, tuple[int, ...]]:
    """What one row of each input must be: obs and states in full, previous actions by
    their width (``_TAIL_ONLY``: the window before it depends on the layout)."""
    shapes = {"obs": tuple(sig.obs_shape), **{f"state_in_{i}": tuple(s.shape) for i, s in enumerate(sig.state)}}
    if sig.uses_prev_actions:
        shapes["prev_actions"] = (sig.prev.action_width,)
    return shapes


_TAIL_ONLY = {"prev_actions"}


def _compare(what: str, name: str, got: Sequence[Any], want: Sequence[int]) -> None:
    got = list(got)
    seen = got[-len(want):] if name in _TAIL_ONLY and len(got) >= len(want) else got
    if len(seen) == len(want) and all(not isinstance(g, int) or g == w for g, w in zip(seen, want, strict=True)):
        return
    shown = ["?" if not isinstance(g, int) else g for g in got]
    part = "ends in" if name in _TAIL_ONLY else "says"
    raise BundleError(f"{what} has rows of shape {shown}, but the manifest's signature {part} {list(want)}")


def _check_action_dist(manifest: Manifest, sig: ModelSignature) -> None:
    """The action distribution fits the action space: the catalog's width for that
    distribution and space is what the manifest says the model outputs."""
    try:
        space = manifest.action_space
        spec = ActionDistSpec.from_json(manifest.action_dist)
    except (KeyError, TypeError, ValueError) as exc:
        raise BundleError(f"manifest.json: action_space or action_dist cannot be read: {exc}") from exc
    config = dict(manifest.model_config)
    if spec.custom or config.get("custom_action_dist"):
        return  # a custom distribution's width is its own code's rule
    try:
        builtin_dist_class(spec.name)
    except ValueError:
        return  # not one of the catalog's classes: nothing to compare with
    try:
        dist_type = None if config.get("q_model") is not None else spec.name
        required = get_action_dist(space, config, dist_type=dist_type).num_outputs
    except (NotImplementedError, TypeError):
        return  # a class with no width rule of its own for this space (nothing to compare with)
    except (UnsupportedActionSpaceError, ValueError) as exc:
        raise BundleError(f"manifest.json: action_dist {spec.name} does not fit action_space {space}: {exc}") from exc
    if required != spec.num_outputs:
        raise BundleError(f"manifest.json: action_space {space} needs {required} dist inputs for {spec.name}, but "
                          f"action_dist.num_outputs is {spec.num_outputs}")
