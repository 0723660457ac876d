"""What the server needs from a runtime: named numpy arrays in, named numpy arrays out."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Runtime(Protocol):
    """One loaded model file.

    ``run`` takes the signature's inputs by name (``obs`` (B, *obs_shape),
    ``state_in_i`` (B, *shape_i), ``prev_actions``, ``prev_rewards``) and returns every
    output by name (``dist_inputs`` (B, num_outputs), ``value`` (B,), ``state_out_i``).
    ``input_dtypes`` says what dtype each input must have; the caller casts, unless
    ``casts_inputs`` (a runtime that copies every input into its own staging buffers casts
    on that copy: integer observations may come in their own dtype).
    With ``value=False`` the runtime may leave ``value`` out and skip the work only it
    needs (ONNX: the bundle's pruned policy graph); ``run_policy`` is ``run(value=False)``.
    """

    kind: str  # "onnx" | "torchscript"
    device: str  # e.g. "cpu", "cuda:0"
    input_dtypes: dict[str, np.dtype]
    casts_inputs: bool

    def run(self, inputs: dict[str, np.ndarray], *, value: bool = True) -> dict[str, np.ndarray]: ...

    def run_policy(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def describe(self) -> dict[str, object]: ...
