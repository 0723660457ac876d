"""A stateful traced module's runtimes stepped through a sequence, state carried (torch).

The export verifies each runtime one step at a time on random states. A recurrent module is
also checked the way a session uses it: every runtime and the eager module each start from
the initial state (zeros, what the session keeps) and feed their own ``state_out`` back for
``STEPS`` steps on fresh observations; every step's outputs must agree under the export's
tolerance rule. A bundle that fails is removed, never left half-right.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rlserve.models.export.bundle import Bundle, BundleError
from rlserve.models.export.exporter import ATOL, RTOL, eager_outputs
from rlserve.models.export.onnx import onnx_runner
from rlserve.models.export.torchscript import torchscript_runner
from rlserve.models.export.verify import MAX_RTOL, compare_outputs

__all__ = ["STEPS", "check_sequence"]

STEPS = 12
BATCH = 3


def _runners(bundle: Bundle, model: Any) -> dict[str, Callable[[dict[str, np.ndarray]], Any]]:
    signature = model.signature()
    runners: dict[str, Callable[[dict[str, np.ndarray]], Any]] = {}
    for fmt in bundle.manifest.runtimes:
        path = bundle.runtime_path(fmt)
        runners[fmt] = (onnx_runner(path) if fmt == "onnx"
                        else torchscript_runner(path, signature.input_names, signature.output_names))
    return runners


def check_sequence(bundle: Bundle, model: torch.nn.Module, make_inputs: Callable[[int, int], dict[str, np.ndarray]]
                   ) -> None:
    """Step every runtime of ``bundle`` and the eager ``model`` together (BundleError if apart)."""
    signature = model.signature()  # type: ignore[operator]
    states = [name for name in signature.input_names if name.startswith("state_in_")]
    zeros = {name: np.zeros_like(make_inputs(BATCH, 0)[name]) for name in states}
    carried = {fmt: dict(zeros) for fmt in ["eager", *bundle.manifest.runtimes]}
    runners = _runners(bundle, model)
    try:
        for step in range(STEPS):
            fresh = make_inputs(BATCH, 1000 + step)
            expected = eager_outputs(model, signature, {**fresh, **carried["eager"]})
            for fmt, run in runners.items():
                got = run({**fresh, **carried[fmt]})
                compare_outputs(got, expected, RTOL, ATOL, max_rtol=MAX_RTOL,
                                what=f"{fmt} at step {step + 1} of a {STEPS}-step sequence (state carried) vs eager")
                carried[fmt] = _next_state(states, got)
            carried["eager"] = _next_state(states, expected)
    except BundleError:
        shutil.rmtree(bundle.root, ignore_errors=True)
        raise


def _next_state(states: list[str], outputs: Any) -> dict[str, np.ndarray]:
    return {name: np.asarray(outputs[name.replace("state_in_", "state_out_")], np.float32) for name in states}
