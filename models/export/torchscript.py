"""TorchScript export of a contract model with ``torch.jit.trace``.

TorchScript is deprecated in torch 2.13 (``torch.jit.trace``/``script``/``save``/``load``
all warn and point to torch.export), but it is still the only format the C++/Python torch
runtime loads without the model's Python class, so the bundle keeps it as a second
runtime. Tracing rather than scripting: the catalog's models (and users' custom models)
are ordinary Python that ``torch.jit.script`` rejects. A trace records one control path
and may bake shapes in, so the exporter checks the traced module at several batch sizes
against the eager model before it writes a bundle.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

METHOD = "torch.jit.trace"


def export_torchscript(
    model: torch.nn.Module, example_inputs: Sequence[torch.Tensor], path: str | Path
) -> dict[str, Any]:
    """Trace ``model`` on ``example_inputs`` and save it to ``path``; return manifest info."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the deprecation notice; a chosen trade-off (module doc)
        traced = torch.jit.trace(model, tuple(example_inputs), check_trace=False, strict=True)
        torch.jit.save(traced, str(path))
    return {"method": METHOD, "torch_version": torch.__version__}


def load_torchscript(path: str | Path) -> torch.jit.ScriptModule:
    """Load a TorchScript file on CPU. Verify the bundle's checksums before calling this."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = torch.jit.load(str(path), map_location="cpu")
    return module.eval()


def torchscript_runner(path: str | Path, input_names: list[str], output_names: list[str]):
    """A ``run(inputs) -> outputs`` callable over a loaded TorchScript module."""
    module = load_torchscript(path)

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        args = [torch.from_numpy(np.ascontiguousarray(inputs[n], dtype=np.float32)) for n in input_names]
        with torch.no_grad():
            outs = module(*args)
        return {n: o.numpy() for n, o in zip(output_names, outs, strict=True)}

    return run
