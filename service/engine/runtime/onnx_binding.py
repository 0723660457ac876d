"""Running an ONNX Runtime session on CUDA: the provider's libraries, and I/O binding.

``session.run`` with numpy inputs copies each input to the GPU from wherever numpy put it
and allocates its outputs anew. ``BoundRunner`` instead stages the batch's inputs in host
blocks reused across batches (pinned where the CUDA runtime allows, ``staging.py``), binds
them once per batch, lets ONNX Runtime copy them to the device inside the run, and has the
outputs copied back to the CPU, where the distribution step reads them. An integer input
the model reads as floats (uint8 frames) is staged in its own dtype and cast on the device
when the runner has a ``DeviceCast`` (``device_cast.py``), else cast by the staging copy.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from rlserve.service.engine.runtime.device_cast import DeviceCast
from rlserve.service.engine.runtime.staging import HostStaging

log = logging.getLogger("rlserve.runtime")

# feed (input name -> array) -> outputs in the runner's output order
Runner = Callable[[dict[str, np.ndarray]], list[np.ndarray]]
_preloaded = False


def preload_cuda_libraries(ort: Any) -> None:
    """Load the CUDA and cuDNN libraries of the ``nvidia-*`` pip wheels before the first
    CUDA session (``onnxruntime.preload_dlls``, ONNX Runtime >= 1.21), so the CUDA provider
    finds them without ``LD_LIBRARY_PATH``. Once per process; a failure is logged, and the
    session creation that follows says whether the provider loaded anyway."""
    global _preloaded
    if _preloaded:
        return
    _preloaded = True
    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        log.info("onnxruntime %s has no preload_dlls: the CUDA libraries must be on the loader's path",
                 ort.__version__)
        return
    try:
        preload()
    except Exception as exc:  # a missing directory, a broken wheel: the session will tell
        log.warning("onnxruntime.preload_dlls failed: %s", exc)


def plain_runner(session: Any, output_names: list[str], run_options: Any) -> Runner:
    """``session.run``: on the CPU provider inputs are read in place, nothing to stage."""

    def run(feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return session.run(output_names, feed, run_options)

    return run


class BoundRunner:
    """One session run through an ``IOBinding``: inputs staged in ``staging`` (shared by
    the runners of one runtime, whose runs never overlap) and bound as CPU memory, or, for
    an integer input of a float model input with ``cast`` given, staged narrow and bound as
    the device's cast of it; every output bound to the CPU. The binding object is kept;
    only its bindings change."""

    def __init__(self, session: Any, output_names: list[str], input_dtypes: dict[str, np.dtype],
                 staging: HostStaging, run_options: Any, cast: DeviceCast | None = None):
        self._session = session
        self._binding = session.io_binding()
        self._output_names = list(output_names)
        self._input_dtypes = input_dtypes
        self._staging = staging
        self._run_options = run_options
        self._cast = cast

    def __call__(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        binding = self._binding
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        cast = []  # the device's values, held until the run has read them
        for name, array in feed.items():
            wanted = self._input_dtypes[name]
            if self._cast is not None and self._cast.takes(array.dtype, wanted, array.ndim):
                cast.append(self._cast(self._staging.stage(name, array), wanted, self._run_options))
                binding.bind_ortvalue_input(name, cast[-1])
                continue
            staged = self._staging.stage(name, array, wanted)
            binding.bind_input(name, "cpu", 0, staged.dtype.type, list(staged.shape), staged.ctypes.data)
        for name in self._output_names:
            binding.bind_output(name, "cpu")
        self._session.run_with_iobinding(binding, self._run_options)
        # Fresh arrays ONNX Runtime allocated for this run: the caller may keep them.
        return binding.copy_outputs_to_cpu()
