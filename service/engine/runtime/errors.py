"""The exceptions a runtime library raises for a model file it cannot load or run.

ONNX Runtime reports a file that is not ONNX, an input of the wrong shape or a graph it
cannot build with its own pybind11 types (``InvalidProtobuf``, ``InvalidArgument``,
``Fail``, ...), which subclass plain ``Exception``; TorchScript raises ``RuntimeError``
or ``torch.jit.Error`` (also a plain ``Exception``). A bundle's files are the client's
input: a load that fails with one of these is a refused bundle (422), never a 500 or a
server that does not start. Only these types are caught, never ``Exception`` at large.
"""

from __future__ import annotations

import functools
import sys

# ONNX Runtime's error types (``onnxruntime.capi.onnxruntime_pybind11_state``) that a model
# file or its inputs can cause; a build without one of them simply lacks it.
_ORT_NAMES = ("Fail", "InvalidArgument", "InvalidProtobuf", "InvalidGraph", "NoSuchFile", "NoModel",
              "NotImplemented", "NotFound", "RuntimeException", "EPFail", "EngineError")


@functools.cache
def _onnxruntime_errors() -> tuple[type[BaseException], ...]:
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as state
    except ImportError:  # no onnxruntime: nothing of it can be raised
        return ()
    found = (getattr(state, name, None) for name in _ORT_NAMES)
    return tuple(t for t in found if isinstance(t, type) and issubclass(t, BaseException))


def runtime_errors() -> tuple[type[BaseException], ...]:
    """The runtime libraries' own error types (ONNX Runtime's; torch's once torch is
    imported, which only a TorchScript runtime does: serving stays torch-free)."""
    errors = _onnxruntime_errors()
    torch = sys.modules.get("torch")
    jit_error = getattr(getattr(torch, "jit", None), "Error", None)
    if isinstance(jit_error, type) and issubclass(jit_error, BaseException):
        errors += (jit_error,)
    return errors
