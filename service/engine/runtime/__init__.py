"""Runtimes that execute an exported policy graph; ``open_runtime`` picks one per bundle."""

from __future__ import annotations

from pathlib import Path

from rlserve.service.device_request import DeviceRequest
from rlserve.service.engine.runtime.base import Runtime
from rlserve.service.engine.runtime.device import DeviceUnavailable
from rlserve.service.engine.runtime.onnx import OnnxRuntime
from rlserve.service.engine.runtime.torchscript import TorchScriptRuntime

__all__ = ["DeviceRequest", "DeviceUnavailable", "Runtime", "open_runtime", "choose_kind"]


def choose_kind(available: list[str], preference: str) -> str:
    """The runtime kind to use: the preference if the bundle has it, ONNX first under 'auto'."""
    if preference != "auto":
        if preference not in available:
            raise ValueError(f"runtime {preference!r} requested, but the bundle only has {sorted(available)}")
        return preference
    for kind in ("onnx", "torchscript"):
        if kind in available:
            return kind
    raise ValueError(f"no supported runtime in the bundle: it has {sorted(available)}, expected onnx or torchscript")


def open_runtime(kind: str, path: Path, *, input_names: list[str], output_names: list[str],
                 intra_op_threads: int, device: DeviceRequest | str = "auto", tensorrt: bool = False,
                 policy_path: Path | None = None, intra_op_spinning: bool = False,
                 device_cast: bool = True) -> Runtime:
    """``policy_path``: the same graph without the value head, where the bundle has one.
    ``device``: ``RLSERVE_DEVICE`` (see ``device.py``); ``tensorrt``: ONNX Runtime's
    TensorRT provider first, where the installed build has it; ``device_cast``: ONNX
    Runtime on CUDA casts integer inputs on the device (``device_cast.py``). Raises ``DeviceUnavailable``
    when CUDA was required and cannot be used."""
    if kind == "onnx":
        return OnnxRuntime(path, intra_op_threads=intra_op_threads, device=device, tensorrt=tensorrt,
                           policy_path=policy_path, intra_op_spinning=intra_op_spinning,
                           device_cast=device_cast)
    if kind == "torchscript":
        return TorchScriptRuntime(path, input_names=input_names, output_names=output_names,
                                  intra_op_threads=intra_op_threads, device=device)
    raise ValueError(f"unknown runtime {kind!r}; expected 'onnx' or 'torchscript'")
