"""Casting a batch's integer inputs to the model's float type on the GPU, not on the host.

A VisionNet's uint8 frames are a quarter of the float32 the model reads. Cast on the host
(into the staging block), every frame is written as 4 bytes per pixel by a CPU core and
copied to the device at that size: for 84x84x4 frames ~113 KB each, which bounds a worker
at a few ten thousand frames/s. ``DeviceCast`` instead runs a one-node ONNX graph (``Cast``)
on the model's own device: its input is the staged uint8 block (host memory, copied to the
device at its own size inside the run) and its output stays on the device, as an
``OrtValue`` the model's binding takes as its input. The values are the ones the host cast
gives (an integer converted to the nearest float; every uint8/int8/int16 is exact).

The graph is written here as protobuf bytes (the ``onnx`` package is an exporter's
dependency, not a server's): a ``ModelProto`` with one ``Cast`` node, input ``x`` of the
integer type and output ``y`` of the float type, both of one rank with every dimension
symbolic (a graph's inputs and outputs must declare their rank), so a session per rank.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

log = logging.getLogger("rlserve.runtime")

# ONNX TensorProto.DataType numbers
_ONNX_TYPES = {
    np.dtype(np.float32): 1, np.dtype(np.uint8): 2, np.dtype(np.int8): 3, np.dtype(np.uint16): 4,
    np.dtype(np.int16): 5, np.dtype(np.int32): 6, np.dtype(np.int64): 7, np.dtype(np.bool_): 9,
    np.dtype(np.float16): 10, np.dtype(np.float64): 11,
}
_IR_VERSION = 8
_OPSET = 17
_ATTRIBUTE_INT = 2  # AttributeProto.AttributeType.INT


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, value: int | bytes | str) -> bytes:
    """One protobuf field: a varint (wire type 0) or length-delimited bytes (wire type 2)."""
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _value_info(name: str, elem_type: int, rank: int) -> bytes:
    shape = b"".join(_field(1, _field(2, f"d{i}")) for i in range(rank))  # Dimension{dim_param}
    tensor_type = _field(1, elem_type) + _field(2, shape)  # TypeProto.Tensor{elem_type, shape}
    return _field(1, name) + _field(2, _field(1, tensor_type))  # ValueInfoProto{name, TypeProto{tensor_type}}


def cast_model(source: np.dtype, target: np.dtype, rank: int) -> bytes:
    """The serialized ONNX model ``y = Cast(x, to=target)`` for ``x`` of dtype ``source``
    and ``rank`` dimensions."""
    attribute = _field(1, "to") + _field(3, _ONNX_TYPES[np.dtype(target)]) + _field(20, _ATTRIBUTE_INT)
    node = _field(1, "x") + _field(2, "y") + _field(3, "cast") + _field(4, "Cast") + _field(5, attribute)
    x, y = _value_info("x", _ONNX_TYPES[np.dtype(source)], rank), _value_info("y", _ONNX_TYPES[np.dtype(target)], rank)
    graph = _field(1, node) + _field(2, "device_cast") + _field(11, x) + _field(12, y)
    opset = _field(1, "") + _field(2, _OPSET)
    return _field(1, _IR_VERSION) + _field(8, opset) + _field(7, graph)


def casts_on_device(source: np.dtype, target: np.dtype) -> bool:
    """Whether ``DeviceCast`` takes this pair: integers (and bools) to a float type."""
    source, target = np.dtype(source), np.dtype(target)
    return source.kind in "iub" and target.kind == "f" and source in _ONNX_TYPES and target in _ONNX_TYPES


class DeviceCast:
    """One small session per (source dtype, target dtype, rank) on ``providers`` (the model's CUDA
    provider, without TensorRT: a graph of one cast gains nothing from an engine build);
    each call casts one staged host array and returns the result as an ``OrtValue`` on
    ``device_type:device_id``. The value is the caller's; it lives as long as it is held."""

    def __init__(self, ort: Any, providers: list, device_type: str, device_id: int):
        self._ort = ort
        self._providers = providers
        self.device_type = device_type
        self.device_id = device_id
        self._runs: dict[tuple[np.dtype, np.dtype, int], tuple[Any, Any] | None] = {}
        self.calls = 0

    def takes(self, source: np.dtype, target: np.dtype, rank: int) -> bool:
        """Whether an input of this dtype and rank is cast here: a pair ``casts_on_device``
        allows whose session could be made (made now, once). A session that cannot be made
        is logged once, and that input is then cast on the host as before."""
        key = (np.dtype(source), np.dtype(target), rank)
        if key not in self._runs:
            self._runs[key] = self._make(*key) if casts_on_device(*key[:2]) else None
        return self._runs[key] is not None

    def _make(self, source: np.dtype, target: np.dtype, rank: int) -> tuple[Any, Any] | None:
        options = self._ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        try:
            session = self._ort.InferenceSession(cast_model(source, target, rank), sess_options=options,
                                                 providers=self._providers)
        except Exception as exc:  # ONNX Runtime raises its own types; any means "not here"
            log.warning("%s -> %s inputs are cast on the host: the device cast did not load: %s", source, target, exc)
            return None
        first = self._providers[0] if isinstance(self._providers[0], str) else self._providers[0][0]
        if first not in session.get_providers():  # ONNX Runtime fell back to another provider by itself
            log.warning("%s -> %s inputs are cast on the host: the device cast runs on %s, not %s", source, target,
                        session.get_providers(), first)
            return None
        return session, session.io_binding()

    def __call__(self, staged: np.ndarray, target: np.dtype, run_options: Any) -> Any:
        run = self._runs[(staged.dtype, np.dtype(target), staged.ndim)]
        assert run is not None, "called for an input that ``takes`` refused"
        session, binding = run
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        binding.bind_input("x", "cpu", 0, staged.dtype.type, list(staged.shape), staged.ctypes.data)
        binding.bind_output("y", self.device_type, self.device_id)
        # The run ends when its stream has finished (ONNX Runtime synchronizes a provider's
        # stream at the end of every run), so the model's run that follows reads a whole cast.
        session.run_with_iobinding(binding, run_options)
        self.calls += 1
        return binding.get_outputs()[0]
