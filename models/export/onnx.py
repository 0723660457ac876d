"""ONNX export of a contract model with torch.onnx's dynamo (torch.export-based) exporter.

Why dynamo and not ``dynamo=False``: in torch 2.13 the TorchScript-based exporter is the
deprecated path (it warns on every call) and the torch.export-based one is the default and
the maintained one; it needs ``onnxscript``. It is slower (about a second per small model once
torchlib's table is built, see ``torchlib_registry.py``; the legacy one a tenth of that) but
exports at a fixed opset with a symbolic batch dimension shared by every input and output,
which torch.export checks while tracing: a model that silently bakes the batch size into its
graph fails at export time, not in production.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlserve.models.export.torchlib_registry import install as install_torchlib_registry
from rlserve.models.interface import ModelSignature

OPSET = 18  # LayerNorm needs >= 17; 18 is supported by every onnxruntime >= 1.14.
EXPORTER = "torch.onnx.export(dynamo=True)"


def export_onnx(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    signature: ModelSignature,
    path: str | Path,
) -> dict[str, Any]:
    """Write ``model`` to ``path`` as one self-contained ONNX file; return its manifest info.

    ``example_inputs`` must have a batch size > 1 (torch.export specialises sizes 0 and 1).
    """
    dynamic = batch_dynamic_shapes(model, len(example_inputs))
    install_torchlib_registry()  # the exporter's translation table is built once per process
    with _quiet_exporter(), torch.no_grad():
        program = torch.onnx.export(
            model,
            tuple(example_inputs),
            input_names=signature.input_names,
            output_names=signature.output_names,
            opset_version=OPSET,
            dynamo=True,
            dynamic_shapes=dynamic,
            optimize=True,
            verbose=False,
        )
    # Weights inside the file: a bundle file must be self-contained for its checksum.
    assert program is not None  # dynamo=True always returns an ONNXProgram
    program.save(str(path), external_data=False)
    _check_io_names(path, signature)
    return {"opset": OPSET, "exporter": EXPORTER, **versions()}


def prune_onnx(path: str | Path, out_path: str | Path, signature: ModelSignature) -> None:
    """Write the graph at ``path`` cut down to ``signature.policy_output_names``: the
    nodes only the value head needs are gone, so acting does not pay for them (ONNX
    Runtime runs every node of a graph whatever outputs a call asks for). Inputs stay
    the signature's, in order, even one that only the value head read."""
    import onnx
    from onnx.utils import Extractor

    model = onnx.load(str(path), load_external_data=False)
    pruned = Extractor(model).extract_model(signature.input_names, signature.policy_output_names)
    used = {i.name for i in pruned.graph.input}
    if used != set(signature.input_names):  # keep the feed contract of the full graph
        del pruned.graph.input[:]
        pruned.graph.input.extend(model.graph.input)
    pruned.ir_version = model.ir_version
    onnx.checker.check_model(pruned)
    onnx.save(pruned, str(out_path))
    _check_io_names(out_path, signature, signature.policy_output_names)


def batch_dynamic_shapes(model: torch.nn.Module, n_inputs: int) -> tuple[Any, ...]:
    """Axis 0 of every input is one shared symbolic batch, in forward()'s own structure.

    torch.export matches ``dynamic_shapes`` to the parameters of ``forward``: a
    ``forward(obs, *inputs)`` takes ``(spec_obs, (spec_0, spec_1, ...))``, not a flat tuple.
    """
    batch = torch.export.Dim("batch", min=1)
    params = list(inspect.signature(model.forward).parameters.values())
    shapes: list[Any] = []
    remaining = n_inputs
    for param in params:
        if remaining == 0:
            break
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            shapes.append(tuple({0: batch} for _ in range(remaining)))
            remaining = 0
        elif param.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            shapes.append({0: batch})
            remaining -= 1
    if remaining:
        raise ValueError(f"{type(model).__name__}.forward takes fewer positional inputs than the {n_inputs} given")
    return tuple(shapes)


def versions() -> dict[str, str]:
    import onnx
    import onnxruntime

    return {
        "torch_version": torch.__version__,
        "onnx_version": onnx.__version__,
        "onnxruntime_version": onnxruntime.__version__,
    }


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The exporter logs optional-dependency notes (torchvision ops) on every call, and its
    graph passes (onnxscript's optimizer and rewriter, onnx_ir's passes) INFO lines on every
    export: a server that exports a checkpoint would show ~10 of them per policy."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript", "onnx_ir")]
    levels = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _check_io_names(path: str | Path, signature: ModelSignature, output_names: list[str] | None = None) -> None:
    """The server feeds inputs and reads outputs by name: they must be the signature's."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    inputs = [i.name for i in graph.input]
    outputs = [o.name for o in graph.output]
    expected = signature.output_names if output_names is None else output_names
    if inputs != signature.input_names or outputs != expected:
        raise ValueError(
            f"exported ONNX graph has inputs {inputs} and outputs {outputs}; the model "
            f"signature needs {signature.input_names} -> {expected}"
        )


def onnx_runner(path: str | Path, threads: int = 1):
    """A ``run(inputs) -> outputs`` callable over an ONNX Runtime CPU session."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = {i.name: np.ascontiguousarray(inputs[i.name], dtype=np.float32) for i in session.get_inputs()}
        return dict(zip(names, session.run(names, feed), strict=True))

    return run
