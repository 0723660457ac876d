"""Build torch.onnx's table of torchlib translations once per process, not at every export.

``torch.onnx.export(dynamo=True)`` starts every call by building an ``ONNXRegistry`` from
torchlib: it resolves each of torchlib's ~1,000 translations to its ATen overload, about 1.5 s
of CPU on a 2-core VM, more than the whole export of a small MLP. A server that exports ten
checkpoints at start, or a test suite that exports a few hundred models, pays it every time.

``install`` wraps ``ONNXRegistry.from_torchlib`` so that each opset's registry is built once
and every call gets a copy of it: its own ``functions`` table with its own lists, so a caller
that registers custom translations into its registry (``custom_translation_table``) changes
that copy alone, as with the original. The wrap is process-wide and permanent, and it is
only installed where the running torch has the private method and the registry holds no
state besides the two attributes copied; anywhere else the exporter runs as it came
(``installed()`` says which). The exported files are the same either way
(tests/unit/test_torchlib_registry.py compares them byte for byte).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

try:  # a private module of torch's exporter: its place has moved between torch releases
    from torch.onnx._internal.exporter import _registration
except ImportError:  # pragma: no cover - torch without the torch.export-based exporter's module
    _registration = None  # type: ignore[assignment]

_STATE = ("_opset_version", "functions")  # everything a registry built from torchlib holds
_lock = threading.Lock()
_built: dict[tuple[Any, ...], Any] = {}
_original: Callable[..., Any] | None = None


def installed() -> bool:
    """Whether ``from_torchlib`` is the caching wrap in this process."""
    return _original is not None


def install() -> bool:
    """Install the caching wrap if this torch allows it; idempotent. Returns ``installed()``."""
    global _original
    registry_class = getattr(_registration, "ONNXRegistry", None)
    method = getattr(registry_class, "from_torchlib", None)
    with _lock:
        if _original is None and method is not None:
            _original = method.__func__  # the classmethod's function
            registry_class.from_torchlib = classmethod(_from_torchlib)  # type: ignore[union-attr]
    return installed()


def _from_torchlib(cls: type, *args: Any, **kwargs: Any) -> Any:
    assert _original is not None
    key = (cls, args, tuple(sorted(kwargs.items())))
    with _lock:
        base = _built.get(key)
        if base is None:
            base = _original(cls, *args, **kwargs)
            if set(vars(base)) != set(_STATE):  # a torch whose registry holds more: do not share it
                return base
            _built[key] = base
    registry = copy.copy(base)
    registry.functions = {target: list(entries) for target, entries in base.functions.items()}
    return registry
