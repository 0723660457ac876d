"""TorchScript backend. torch is imported here, lazily, so ONNX-only serving never needs it.

On CUDA each batch's inputs are staged in pinned host blocks reused across batches
(``staging.py``), copied to the device without blocking, the module runs, its outputs are
copied back into pinned blocks without blocking, and the stream is synchronised once.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from rlserve.service.device_request import DeviceRequest
from rlserve.service.engine.runtime.device import Placement, torch_placement
from rlserve.service.engine.runtime.staging import HostStaging
from rlserve.service.engine.runtime.traced_graph import exact_convolutions, retarget_devices

log = logging.getLogger("rlserve.runtime")
# Inputs may be read-only views of a request body (binary tensor data); the module only
# reads them, under inference_mode, so torch's warning about non-writable arrays is noise.
warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)


def _placement(torch: Any, request: DeviceRequest) -> Placement:
    built_with_cuda = torch.version.cuda is not None
    devices = torch.cuda.device_count() if built_with_cuda and request.kind != "cpu" else 0
    return torch_placement(request, built_with_cuda, devices)


def _exact_float32(torch: Any) -> None:
    """No TF32 on Ampere and newer: torch leaves it off for matmuls but on for cuDNN
    convolutions, whose 10-bit mantissa is far outside the export tolerance (docs/export.md).
    Process-wide, as torch's switches are; a traced module's convolutions carry their own
    flag, which ``exact_convolutions`` clears."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _torch_pinned(torch: Any):
    def allocate(nbytes: int) -> np.ndarray:
        # The array's base is the tensor, which keeps the pinned memory alive.
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy()

    return allocate


class TorchScriptRuntime:
    kind = "torchscript"

    def __init__(self, path: Path, *, input_names: list[str], output_names: list[str],
                 intra_op_threads: int = 1, device: DeviceRequest | str = "auto"):
        import torch

        if intra_op_threads > 0:
            torch.set_num_threads(intra_op_threads)
        self._torch = torch
        request = device if isinstance(device, DeviceRequest) else DeviceRequest.parse(device)
        placement = _placement(torch, request)
        self._device = torch.device(placement.device)
        self.device = placement.device
        self.device_setting = str(request)
        self._cuda = placement.cuda
        if self._cuda:
            _exact_float32(torch)
        with warnings.catch_warnings():  # torch 2.13 deprecates jit.load; the bundle format uses it
            warnings.simplefilter("ignore", DeprecationWarning)
            self._module = torch.jit.load(str(path), map_location=self._device).eval()
        retargeted = retarget_devices(self._module, self.device) if self._cuda else 0
        exact = exact_convolutions(self._module) if self._cuda else 0
        self._input_names = list(input_names)
        self.output_names = list(output_names)
        # The traced module takes float32 everywhere. On the CPU the caller casts; on CUDA
        # inputs go through pinned blocks in the dtype they came in (a uint8 frame is a
        # quarter of its float32 bytes on the bus) and become float32 on the device.
        self.input_dtypes = {name: np.dtype(np.float32) for name in self._input_names}
        self._inputs = HostStaging(_torch_pinned(torch), "pinned") if self._cuda else None
        self.casts_inputs = self._cuda
        self._outputs = HostStaging(_torch_pinned(torch), "pinned") if self._cuda else None
        notes = "".join(f"; {note}" for note in placement.notes)
        if retargeted:
            notes += f"; {retargeted} traced CPU device literals moved to {self.device}"
        if exact:
            notes += f"; TF32 turned off in {exact} traced convolutions"
        log.info("torchscript runtime %s on %s%s", path.name, self.device, notes)

    def run(self, inputs: dict[str, np.ndarray], *, value: bool = True) -> dict[str, np.ndarray]:
        """Every output (the module has one graph; ``value=False`` changes nothing)."""
        if self._cuda:
            return self._run_cuda(inputs)
        torch = self._torch
        args = [torch.from_numpy(np.ascontiguousarray(inputs[name])) for name in self._input_names]
        with torch.inference_mode():
            outputs = self._module(*args)
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        return {name: out.detach().numpy() for name, out in zip(self.output_names, outputs, strict=True)}

    def _run_cuda(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self._torch
        assert self._inputs is not None and self._outputs is not None
        with torch.inference_mode():
            args = [torch.from_numpy(self._inputs.stage(name, inputs[name])).to(self._device, non_blocking=True)
                    .to(torch.float32) for name in self._input_names]
            outputs = self._module(*args)
            if isinstance(outputs, torch.Tensor):
                outputs = (outputs,)
            host = []
            for name, out in zip(self.output_names, outputs, strict=True):
                view = self._outputs.view(name, tuple(out.shape), np.dtype(str(out.dtype).removeprefix("torch.")))
                torch.from_numpy(view).copy_(out, non_blocking=True)
                host.append(view)
            torch.cuda.current_stream(self._device).synchronize()  # the one wait of the batch
        # Copies: the pinned blocks are the next batch's.
        return {name: view.copy() for name, view in zip(self.output_names, host, strict=True)}

    def run_policy(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.run(inputs, value=False)

    def describe(self) -> dict[str, object]:
        described: dict[str, object] = {"kind": self.kind, "device": self.device, "device_setting": self.device_setting}
        if self._inputs is not None:
            described["input_staging"] = self._inputs.kind
        return described
