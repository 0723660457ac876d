"""TorchScript backend. torch is imported here, lazily, so ONNX-only serving never needs it."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np

log = logging.getLogger("rlserve.runtime")
# Inputs may be read-only views of a request body (binary tensor data); the module only
# reads them, under inference_mode, so torch's warning about non-writable arrays is noise.
warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)


class TorchScriptRuntime:
    kind = "torchscript"

    def __init__(self, path: Path, *, input_names: list[str], output_names: list[str],
                 intra_op_threads: int = 1, use_gpu: bool = True):
        import torch

        if intra_op_threads > 0:
            torch.set_num_threads(intra_op_threads)
        self._torch = torch
        self._device = torch.device("cuda" if use_gpu and torch.cuda.is_available() else "cpu")
        self.device = str(self._device)
        with warnings.catch_warnings():  # torch 2.13 deprecates jit.load; the bundle format uses it
            warnings.simplefilter("ignore", DeprecationWarning)
            self._module = torch.jit.load(str(path), map_location=self._device).eval()
        self._input_names = list(input_names)
        self.output_names = list(output_names)
        # The exported contract feeds float32 everywhere except a pass-through obs dtype,
        # which the caller already produces; keep what it hands us for obs.
        self.input_dtypes = {name: np.dtype(np.float32) for name in self._input_names}
        log.info("torchscript runtime %s on %s", path.name, self.device)

    def run(self, inputs: dict[str, np.ndarray], *, value: bool = True) -> dict[str, np.ndarray]:
        """Every output (the module has one graph; ``value=False`` changes nothing)."""
        torch = self._torch
        args = [torch.from_numpy(np.ascontiguousarray(inputs[name])).to(self._device) for name in self._input_names]
        with torch.inference_mode():
            outputs = self._module(*args)
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        return {name: out.detach().cpu().numpy() for name, out in zip(self.output_names, outputs, strict=True)}

    def run_policy(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.run(inputs, value=False)

    def describe(self) -> dict[str, object]:
        return {"kind": self.kind, "device": self.device}
