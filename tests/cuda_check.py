"""What the `gpu` tests need, and when it is absent, what exactly is missing (the skip
reason). A skip here is only for hardware or a build this machine lacks; where CUDA is
present a runtime that cannot use it fails its test, it is not skipped.

Also the export tolerance as a test check, and its measure in float32 roundoffs
(docs/export.md), which the CUDA tests record for the CPU/GPU table.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from rlserve.models.export.exporter import ATOL, RTOL
from rlserve.models.export.verify import MAX_RTOL, UNIT_ROUNDOFF, compare_outputs, output_scale
from rlserve.service.engine.runtime.device import CUDA_EP, cuda_device_count


@functools.cache
def onnx_cuda_missing() -> str | None:
    """None when ONNX Runtime can be asked for CUDA here, else what is missing."""
    import onnxruntime as ort

    if CUDA_EP not in ort.get_available_providers():
        return f"onnxruntime {ort.__version__} has no {CUDA_EP} (the CPU wheel; install onnxruntime-gpu)"
    count, why = cuda_device_count()
    return None if count else f"no CUDA device: {why}"


@functools.cache
def torch_cuda_missing() -> str | None:
    """None when torch can run on CUDA here, else what is missing."""
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build"
    return None if torch.cuda.is_available() else "torch.cuda sees no CUDA device"


def needs(missing: str | None) -> pytest.MarkDecorator:
    return pytest.mark.skipif(missing is not None, reason=missing or "")


def roundoffs(actual: np.ndarray, expected: np.ndarray) -> float:
    """max |a - e| in float32 roundoffs of the output's largest magnitude (NaNs and
    masked sentinels, which must match exactly, are left out)."""
    a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    finite = np.isfinite(e) & (np.abs(e) < 1e30)
    if not finite.any():
        return 0.0
    scale = output_scale(e) or 1.0
    return float(np.abs(a[finite] - e[finite]).max() / (UNIT_ROUNDOFF * scale))


def within_export_tolerance(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    """The rule new bundles are verified with at export and at load (raises BundleError)."""
    compare_outputs({"output": actual}, {"output": np.asarray(expected)}, RTOL, ATOL, what=what, max_rtol=MAX_RTOL)
