"""A traced module's graphs are rewritten for the device it is served on.

``torch.jit.trace`` bakes ``device=x.device`` in as the CPU; on CUDA those tensors would
stay on the CPU and the first op mixing them with the inputs would fail. Retargeted here
to the ``meta`` device (no GPU needed): the literals must now make meta tensors, which the
module then refuses to mix with its CPU inputs, proving the rewrite reaches execution.

It also bakes TF32 into every convolution (``allow_tf32`` true), which on an H100 put a
VisionNet 20x outside the export tolerance; the rewrite clears that flag and nothing else."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import svc_bundles

from rlserve.models.export.bundle import load_bundle
from rlserve.service.engine.runtime.traced_graph import exact_convolutions, retarget_devices

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> dict[str, Path]:
    from rlserve.models.export.exporter import export_bundle

    out = {}
    for name in ("gtrxl", "mlp", "image"):
        spec = svc_bundles.SPECS[name]
        root = tmp_path_factory.mktemp(name)
        export_bundle(svc_bundles.build_model(name), obs_space=spec["obs"], action_space=spec["act"],
                      model_config=spec["config"], out_dir=root / name, name=name, formats=["torchscript"])
        out[name] = root / name
    return out


def _load(bundle_dir: Path):
    bundle = load_bundle(bundle_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = torch.jit.load(str(bundle.runtime_path("torchscript")), map_location="cpu").eval()
    with np.load(bundle.root / "reference.npz") as ref:
        inputs = [torch.from_numpy(ref[f"inputs/{name}"]) for name in bundle.manifest.input_names]
    return module, inputs


def test_device_literals_of_a_traced_gtrxl_follow_the_target_device(traced):
    plain, inputs = _load(traced["gtrxl"])
    plain(*inputs)  # as loaded, on the CPU: runs
    module, _ = _load(traced["gtrxl"])
    assert retarget_devices(module, "meta") >= 1  # before the first call, as the runtime does
    with pytest.raises(RuntimeError, match="meta"):
        module(*inputs)


def test_a_module_without_device_literals_is_left_alone(traced):
    module, inputs = _load(traced["mlp"])
    expected = module(*inputs)
    assert retarget_devices(module, "meta") == 0
    for got, want in zip(module(*inputs), expected, strict=True):
        assert torch.equal(got, want)


def _convolution_flags(module) -> list[list[object]]:
    """(benchmark, deterministic, cudnn_enabled, allow_tf32) of every traced convolution."""
    flags = []
    for submodule in module.modules():
        try:
            graph = submodule._c._get_method("forward").graph
        except RuntimeError:
            continue
        flags += [[i.toIValue() for i in list(n.inputs())[9:]] for n in graph.nodes()
                  if n.kind() == "aten::_convolution"]
    return flags


def test_traced_convolutions_lose_tf32_and_keep_everything_else(traced):
    module, inputs = _load(traced["image"])
    flags = _convolution_flags(module)
    assert flags and all(f[3] is True for f in flags), flags  # as torch.jit.trace records them
    assert exact_convolutions(module) == len(flags)
    assert _convolution_flags(module) == [[*f[:3], False] for f in flags]  # cuDNN stays enabled
    assert exact_convolutions(module) == 0
    plain, _ = _load(traced["image"])
    for got, want in zip(module(*inputs), plain(*inputs), strict=True):
        assert torch.equal(got, want)  # on the CPU the flag changes no result


def test_a_module_without_convolutions_has_none_to_change(traced):
    module, _ = _load(traced["mlp"])
    assert exact_convolutions(module) == 0
