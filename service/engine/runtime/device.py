"""Where a runtime runs: the ``RLSERVE_DEVICE`` setting (``rlserve.service.device_request``),
whether this machine has a CUDA device, and the ONNX Runtime execution providers that
follow from both.

``auto`` takes CUDA when the runtime can use it and says in the log why it did not
otherwise; ``cpu`` never touches CUDA; ``cuda`` / ``cuda:N`` is a requirement: a bundle
that cannot run there is refused (``DeviceUnavailable``), never quietly served on the CPU.

Everything here but ``cuda_device_count`` is a pure function of its arguments, so the
choices are tested without a GPU.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass, field

from rlserve.service.device_request import DeviceRequest

CUDA_EP = "CUDAExecutionProvider"
TENSORRT_EP = "TensorrtExecutionProvider"
CPU_EP = "CPUExecutionProvider"
# CUDA provider options (values are strings, as ONNX Runtime takes them):
# - use_tf32 0: H100/A100 would otherwise round matmul and conv inputs to TF32 (10-bit
#   mantissa), ~1000x float32's rounding and far outside the export tolerance the bundle
#   is verified with at load (docs/export.md);
# - cudnn_conv_algo_search HEURISTIC: ONNX Runtime's default (EXHAUSTIVE) benchmarks every
#   cuDNN algorithm once per new input shape, and a dynamic batcher makes a new batch size
#   (a new shape) all the time: each would stall its batch by tens of milliseconds.
CUDA_OPTIONS = {"use_tf32": "0", "cudnn_conv_algo_search": "HEURISTIC"}

ProviderSpec = str | tuple[str, dict[str, str]]


class DeviceUnavailable(RuntimeError):
    """``RLSERVE_DEVICE`` names CUDA explicitly and the runtime cannot run there."""


@dataclass(frozen=True)
class Placement:
    """What a runtime will do: its device (``cpu`` / ``cuda:N``), the ONNX Runtime
    providers to ask for (empty for TorchScript), notes for the log line (why CPU, what
    was asked for but is missing), and ``advice``: how this install could serve on a GPU,
    which nobody asked for (said once per process, not in every model's line)."""

    device: str
    providers: list[ProviderSpec] = field(default_factory=list)
    notes: tuple[str, ...] = ()
    advice: str = ""

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")


def _cpu(request: DeviceRequest, reason: str) -> Placement:
    """CPU when ``auto`` may fall back; ``DeviceUnavailable`` when CUDA was required."""
    if request.required:
        raise DeviceUnavailable(f"RLSERVE_DEVICE={request} but {reason}; set RLSERVE_DEVICE=auto to fall "
                                "back to the CPU, or cpu")
    note = "device cpu (RLSERVE_DEVICE=cpu)" if request.kind == "cpu" else f"no CUDA: {reason}; serving on the CPU"
    return Placement("cpu", [CPU_EP], (note,))


def _check_index(request: DeviceRequest, devices: int, reason: str) -> str | None:
    """Why CUDA device ``request.index`` cannot be used (None when it can)."""
    if devices <= 0:
        return reason or "no CUDA device was found"
    if request.index >= devices:
        return f"there is no CUDA device {request.index} (this machine shows {devices})"
    return None


def onnx_placement(request: DeviceRequest, available: list[str], devices: int, reason: str = "", *,
                   tensorrt: bool = False) -> Placement:
    """The providers for ``request``, given ONNX Runtime's compiled-in ``available``
    providers and ``devices`` CUDA devices (``reason``: why there are none).

    TensorRT's provider goes first only when asked for (``tensorrt``) and compiled in;
    CUDA's follows it for the nodes TensorRT does not take, then the CPU's.
    """
    if request.kind == "cpu":
        return _cpu(request, "")
    if CUDA_EP not in available:
        reason = (f"this onnxruntime build has no {CUDA_EP} (install onnxruntime-gpu instead of onnxruntime; "
                  f"it offers {available})")
        if request.kind == "auto":  # a CPU install serving on the CPU: nothing to note per model
            return Placement("cpu", [CPU_EP], advice=f"no CUDA: {reason}; serving on the CPU")
        return _cpu(request, reason)
    missing = _check_index(request, devices, reason)
    if missing is not None:
        return _cpu(request, missing)
    providers: list[ProviderSpec] = [(CUDA_EP, {"device_id": str(request.index), **CUDA_OPTIONS}), CPU_EP]
    notes: list[str] = []
    if tensorrt:
        if TENSORRT_EP in available:
            providers.insert(0, (TENSORRT_EP, {"device_id": str(request.index)}))
            notes.append("TensorRT first (RLSERVE_ONNX_TENSORRT)")
        else:
            notes.append(f"RLSERVE_ONNX_TENSORRT is set but this onnxruntime build has no {TENSORRT_EP}; "
                         "CUDA only")
    return Placement(f"cuda:{request.index}", providers, tuple(notes))


def torch_placement(request: DeviceRequest, built_with_cuda: bool, devices: int) -> Placement:
    """The torch device for ``request`` (``built_with_cuda``: ``torch.version.cuda`` is set)."""
    if request.kind == "cpu":
        return _cpu(request, "")
    if not built_with_cuda:
        return _cpu(request, "this torch build has no CUDA (a +cpu wheel)")
    missing = _check_index(request, devices, "torch.cuda sees no CUDA device")
    if missing is not None:
        return _cpu(request, missing)
    return Placement(f"cuda:{request.index}")


def settle(request: DeviceRequest, placement: Placement, session_providers: list[str]) -> Placement:
    """The placement an ONNX Runtime session actually got. Asked for CUDA, ONNX Runtime
    falls back to the CPU by itself when its CUDA provider cannot load (a missing
    libcublas or cuDNN, no driver): refused when CUDA was required, noted under ``auto``."""
    if not placement.cuda or CUDA_EP in session_providers or TENSORRT_EP in session_providers:
        return placement
    reason = (f"onnxruntime could not start its {CUDA_EP} (its error is logged above: usually a CUDA or "
              "cuDNN library it cannot load)")
    if request.required:
        raise DeviceUnavailable(f"RLSERVE_DEVICE={request} but {reason}")
    return Placement("cpu", [CPU_EP], (f"no CUDA: {reason}; serving on the CPU",))


@functools.cache
def cuda_device_count() -> tuple[int, str]:
    """(CUDA devices this process can see, why none when 0), asked of the NVIDIA driver
    (``libcuda.so.1``) directly, so neither torch nor a CUDA toolkit is needed to know.
    ``CUDA_VISIBLE_DEVICES`` applies as it does to every CUDA program."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0, "no NVIDIA driver (libcuda.so.1 is not loadable)"
    status = driver.cuInit(0)
    if status != 0:
        # 100: CUDA_ERROR_NO_DEVICE (none, or CUDA_VISIBLE_DEVICES hides them all)
        return 0, f"the NVIDIA driver found no usable device (cuInit error {status})"
    count = ctypes.c_int(0)
    status = driver.cuDeviceGetCount(ctypes.byref(count))
    if status != 0:
        return 0, f"the NVIDIA driver could not count devices (cuDeviceGetCount error {status})"
    return count.value, "" if count.value else "the NVIDIA driver reports 0 devices"
