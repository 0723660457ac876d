"""Rewrites of a traced TorchScript module's graphs before it runs on CUDA.

``torch.jit.trace`` records some of the settings in force while it ran as constants of the
graph, where the process-wide switches that the TorchScript runtime sets no longer reach:

- ``torch.arange(n, device=x.device)`` keeps the device the trace ran on (the CPU), so a
  module loaded onto CUDA would make those tensors on the CPU and fail on the first op that
  mixes them with its inputs (the GTrXL's relative positions, a one-hot of previous
  discrete actions). ``map_location`` moves weights and tensor constants, not these.
- every convolution becomes ``aten::_convolution(..., allow_tf32)`` with ``allow_tf32``
  as it was at trace time (torch's default: on). On Ampere and newer GPUs cuDNN then
  rounds the inputs to TF32's 10-bit mantissa: measured on an H100, a VisionNet answered
  ~10,000 float32 roundoffs away from the CPU, 20x the export tolerance (docs/export.md).

Both run before the first call, while the graphs are not yet compiled. torch is never
imported here: the functions take the loaded module.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# aten::_convolution(input, weight, bias, stride, padding, dilation, transposed,
#                    output_padding, groups, benchmark, deterministic, cudnn_enabled, allow_tf32)
_CONVOLUTION = "aten::_convolution"
_ALLOW_TF32 = 12


def _nodes(block: Any) -> Iterator[Any]:
    for node in block.nodes():
        yield node
        for inner in node.blocks():
            yield from _nodes(inner)


def _graph_nodes(module: Any) -> Iterator[tuple[Any, Any]]:
    """(graph, node) for every node of every submodule's forward."""
    for submodule in module.modules():
        try:
            graph = submodule._c._get_method("forward").graph
        except RuntimeError:  # a submodule without a forward of its own
            continue
        for node in _nodes(graph):
            yield graph, node


def retarget_devices(module: Any, device: str) -> int:
    """Point the CPU device literals of a traced module's graphs at ``device``; how many."""
    count = 0
    for _, node in _graph_nodes(module):
        if (node.kind() == "prim::Constant" and node.output().type().kind() == "DeviceObjType"
                and node.s("value") == "cpu"):
            node.s_("value", device)
            count += 1
    return count


def exact_convolutions(module: Any) -> int:
    """Turn off the TF32 flag traced into each convolution; how many were on.

    The flag's constant may be shared with other arguments (``cudnn_enabled`` is the same
    ``True``), so each convolution gets a ``False`` of its own rather than the shared
    constant being changed."""
    count = 0
    for graph, node in list(_graph_nodes(module)):
        if node.kind() != _CONVOLUTION:
            continue
        flag = list(node.inputs())[_ALLOW_TF32]
        if flag.node().kind() != "prim::Constant" or flag.toIValue() is not True:
            continue
        graph.setInsertPoint(node)
        node.replaceInput(_ALLOW_TF32, graph.insertConstant(False))
        count += 1
    return count
