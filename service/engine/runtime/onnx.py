"""ONNX Runtime backend: the device ``RLSERVE_DEVICE`` asks for (``device.py``), CUDA
through I/O binding (``onnx_binding.py``), the CPU provider with plain ``session.run``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from rlserve.service.device_request import DeviceRequest
from rlserve.service.engine.runtime.device import CPU_EP, CUDA_EP, Placement, cuda_device_count, onnx_placement, settle
from rlserve.service.engine.runtime.device_cast import DeviceCast
from rlserve.service.engine.runtime.onnx_binding import BoundRunner, Runner, plain_runner, preload_cuda_libraries
from rlserve.service.engine.runtime.staging import HostStaging, pinned_staging

log = logging.getLogger("rlserve.runtime")

_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


def _session_options(ort: Any, intra_op_threads: int, intra_op_spinning: bool) -> Any:
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    # With more than one intra-op thread, ONNX Runtime's pool threads spin-wait for work
    # unless told not to: on a server they would take the cores the event loop needs.
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if intra_op_spinning else "0")
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return options


def place(ort: Any, request: DeviceRequest, tensorrt: bool) -> Placement:
    """Where ``request`` puts a session with this onnxruntime build on this machine."""
    available = ort.get_available_providers()
    wants_cuda = request.kind != "cpu" and CUDA_EP in available
    devices, why = cuda_device_count() if wants_cuda else (0, "")
    return onnx_placement(request, available, devices, why, tensorrt=tensorrt)


_ADVISED: set[str] = set()


def advise_once(advice: str) -> None:
    """A placement's advice, once per process: at INFO where this machine has a CUDA device
    the install cannot use, else at DEBUG (a CPU install on a machine without a GPU is as
    it should be, and every start of every model said so in 300 characters)."""
    if not advice or advice in _ADVISED:
        return
    _ADVISED.add(advice)
    log.log(logging.INFO if cuda_device_count()[0] else logging.DEBUG, "%s", advice)


def cast_on(ort: Any, placement: Placement) -> DeviceCast:
    """The device cast for a CUDA placement: its CUDA provider (not TensorRT's) and the
    device index of ``placement.device`` ("cuda:N")."""
    providers = [spec for spec in placement.providers
                 if spec == CPU_EP or (isinstance(spec, tuple) and spec[0] == CUDA_EP)]
    return DeviceCast(ort, providers, "cuda", int(placement.device.split(":", 1)[1]))


class OnnxRuntime:
    kind = "onnx"

    def __init__(self, path: Path, *, intra_op_threads: int = 1, device: DeviceRequest | str = "auto",
                 tensorrt: bool = False, policy_path: Path | None = None, intra_op_spinning: bool = False,
                 device_cast: bool = True):
        import onnxruntime as ort

        request = device if isinstance(device, DeviceRequest) else DeviceRequest.parse(device)
        options = _session_options(ort, intra_op_threads, intra_op_spinning)
        placement = place(ort, request, tensorrt)
        if placement.cuda:
            preload_cuda_libraries(ort)
        self._session = ort.InferenceSession(str(path), sess_options=options, providers=placement.providers)
        placement = settle(request, placement, self._session.get_providers())
        advise_once(placement.advice)
        # The same graph without the value head (bundles exported since it exists): what a
        # batch that nobody asked the value of runs. ONNX Runtime would run every node of
        # the full graph whatever outputs were requested.
        self._policy_session = (None if policy_path is None else
                                ort.InferenceSession(str(policy_path), sess_options=options,
                                                     providers=placement.providers))
        self._policy_outputs = ([] if self._policy_session is None else
                                [o.name for o in self._policy_session.get_outputs()])
        self.providers = self._session.get_providers()
        self.device = placement.device
        self.device_setting = str(request)
        self.input_dtypes = {i.name: np.dtype(_ORT_TYPES.get(i.type, np.float32)) for i in self._session.get_inputs()}
        self.output_names = [o.name for o in self._session.get_outputs()]
        # The graph's declared dims (a str or None where symbolic, the batch dim among them).
        self.declared_shapes = {i.name: tuple(i.shape) for i in (*self._session.get_inputs(),
                                                                 *self._session.get_outputs())}
        run_options = ort.RunOptions()
        self.staging: HostStaging | None = pinned_staging() if placement.cuda else None
        self.casts_inputs = self.staging is not None  # the staging copy or the device casts (``BoundRunner``)
        self._device_cast = cast_on(ort, placement) if self.staging is not None and device_cast else None
        self._run_full = self._runner(self._session, self.output_names, run_options)
        self._run_policy = (None if self._policy_session is None else
                            self._runner(self._policy_session, self._policy_outputs, run_options))
        staged = "" if self.staging is None else f"; inputs staged in {self.staging.kind} memory"
        notes = "".join(f"; {note}" for note in placement.notes)
        log.info("onnx runtime %s on %s (providers %s%s%s)", path.name, self.device, self.providers, staged, notes)

    def _runner(self, session: Any, output_names: list[str], run_options: Any) -> Runner:
        if self.staging is None:
            return plain_runner(session, output_names, run_options)
        return BoundRunner(session, output_names, self.input_dtypes, self.staging, run_options, self._device_cast)

    def run(self, inputs: dict[str, np.ndarray], *, value: bool = True) -> dict[str, np.ndarray]:
        feed = {name: inputs[name] for name in self.input_dtypes}
        if not value and self._run_policy is not None:
            return dict(zip(self._policy_outputs, self._run_policy(feed), strict=True))
        return dict(zip(self.output_names, self._run_full(feed), strict=True))

    def run_policy(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.run(inputs, value=False)

    def describe(self) -> dict[str, object]:
        described: dict[str, object] = {"kind": self.kind, "device": self.device, "providers": list(self.providers),
                                        "policy_graph": self._policy_session is not None,
                                        "device_setting": self.device_setting}
        if self.staging is not None:
            described["input_staging"] = self.staging.kind
            described["inputs_cast_on_device"] = self._device_cast is not None
        return described
