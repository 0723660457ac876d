"""torch.onnx's torchlib table is built once per process and handed out as copies
(models/export/torchlib_registry.py), and exports come out byte for byte as without it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.onnx._internal.exporter import _registration

from rlserve.models.export import onnx as onnx_export
from rlserve.models.export import torchlib_registry
from rlserve.models.interface import ModelSignature


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x)).softmax(-1)


class _Contract(torch.nn.Module):
    """The model contract's two outputs (dist inputs, value)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.linear(obs)
        return out[:, :2], out[:, 2]


def _export(model: torch.nn.Module, path: Path) -> bytes:
    program = torch.onnx.export(
        model, (torch.randn(3, 4),), dynamo=True, opset_version=18, optimize=True,
        dynamic_shapes=({0: torch.export.Dim("batch")},),
    )
    assert program is not None
    program.save(str(path), external_data=False)
    return path.read_bytes()


def test_this_torch_takes_the_wrap() -> None:
    """The torch in pyproject's range has the private method: the wrap must be in effect here
    (a torch that moved it fails this test, as the xdist and uvicorn guards do)."""
    assert torchlib_registry.install()
    assert _registration.ONNXRegistry.from_torchlib.__func__ is torchlib_registry._from_torchlib


def test_the_table_is_built_once_and_each_call_gets_its_own_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    torchlib_registry.install()
    first = _registration.ONNXRegistry.from_torchlib()
    builds: list[object] = []
    original = torchlib_registry._original
    monkeypatch.setattr(torchlib_registry, "_original", lambda *a, **k: builds.append(a) or original(*a, **k))
    second = _registration.ONNXRegistry.from_torchlib()
    assert not builds  # the second call built nothing
    assert first is not second and first.functions is not second.functions
    assert first.functions.keys() == second.functions.keys() and len(first.functions) > 100
    target = next(iter(first.functions))
    assert first.functions[target] == second.functions[target]
    assert first.functions[target] is not second.functions[target]

    # A caller's custom translation stays in its own copy, as with a freshly built registry.
    first.register_op(target, lambda *args: None, is_complex=False)
    assert len(first.functions[target]) == len(second.functions[target]) + 1
    third = _registration.ONNXRegistry.from_torchlib()
    assert len(third.functions[target]) == len(second.functions[target])


def test_exports_are_the_same_bytes_with_and_without_the_wrap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torchlib_registry.install()
    model = _Tiny()
    wrapped = _export(model, tmp_path / "wrapped.onnx")
    assert torchlib_registry._original is not None
    monkeypatch.setattr(_registration.ONNXRegistry, "from_torchlib", classmethod(torchlib_registry._original))
    plain = _export(model, tmp_path / "plain.onnx")
    assert wrapped == plain


def test_the_exporter_installs_the_wrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    monkeypatch.setattr(onnx_export, "install_torchlib_registry", lambda: calls.append(True) or True)
    signature = ModelSignature(obs_shape=(4,), num_outputs=2)
    onnx_export.export_onnx(_Contract(), [torch.randn(3, 4)], signature, tmp_path / "model.onnx")
    assert calls
