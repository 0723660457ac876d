"""What a GPU machine offers rlserve, printed (scripts/gpu_device_check.sh runs it first).

    python scripts/gpu_env_report.py

The driver and device, Python and the packages that matter, torch's CUDA and TF32 switches,
ONNX Runtime's build and providers, and then real work: a small ONNX graph run on CUDA
through rlserve's own runtime (its providers, provider options, input staging and log
line), compared with numpy. Each part prints what it found or why it failed, and the last
line says whether ONNX Runtime and torch ran on CUDA. Exit status 0 when ONNX Runtime ran on
CUDA (1 otherwise: the run's other steps then cannot prove anything on the GPU).
"""

from __future__ import annotations

import importlib.metadata as metadata
import logging
import os
import platform
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

PACKAGES = ("rlserve", "torch", "onnxruntime", "onnxruntime-gpu", "onnx", "onnxscript", "numpy", "uvicorn",
            "fastapi", "starlette", "pydantic", "pydantic-settings", "msgspec", "httptools", "uvloop", "gymnasium",
            "pytest", "pytest-xdist", "nvidia-cudnn-cu13", "nvidia-cublas", "nvidia-cuda-runtime")


def part(title: str, body: Callable[[], object]) -> object:
    print(f"\n--- {title}", flush=True)
    try:
        return body()
    except Exception:
        traceback.print_exc(file=sys.stdout)
        return None


def driver() -> None:
    try:
        print(subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"nvidia-smi: {exc}")
    from rlserve.service.engine.runtime.device import cuda_device_count

    print(f"rlserve's driver probe (libcuda.so.1): {cuda_device_count()}")
    print(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}")
    print(f"LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH')!r}")


def packages() -> None:
    import rlserve.service

    print(f"python {sys.version} at {sys.executable}; {platform.platform()}; {os.cpu_count()} cores")
    print(f"rlserve from {Path(rlserve.service.__file__).parent}")
    for name in PACKAGES:
        try:
            print(f"  {name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            print(f"  {name}: not installed")


def torch_cuda() -> bool:
    import torch

    print(f"torch {torch.__version__} from {torch.__file__}; built with CUDA {torch.version.cuda}")
    print(f"torch.cuda.is_available() = {torch.cuda.is_available()}")
    if not torch.cuda.is_available():
        return False
    print(f"device 0: {torch.cuda.get_device_name(0)}, capability {torch.cuda.get_device_capability(0)}")
    print(f"cuDNN {torch.backends.cudnn.version()}; defaults: matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32}"
          f" cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}")
    x = torch.randn(256, 256, device="cuda")
    exact = (x.double() @ x.double()).float()
    torch.backends.cuda.matmul.allow_tf32 = True
    tf32 = (x @ x - exact).abs().max().item()
    torch.backends.cuda.matmul.allow_tf32 = False
    fp32 = (x @ x - exact).abs().max().item()
    print(f"256x256 matmul max |error| vs float64: TF32 {tf32:.3g}, float32 {fp32:.3g} (what use_tf32 0 saves)")
    return True


def tiny_model(path: Path) -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((64, 8)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["obs", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["dist_inputs"])],
        "tiny", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("dist_inputs", TensorProto.FLOAT, ["batch", 8])], [weight, bias])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), str(path))


def onnx_cuda() -> bool:
    import numpy as np
    import onnx
    import onnxruntime as ort

    from rlserve.service.engine.runtime.onnx import OnnxRuntime

    print(f"onnxruntime {ort.__version__} from {ort.__file__}; device {ort.get_device()}")
    print(f"available providers: {ort.get_available_providers()}")
    print(f"preload_dlls: {'present' if hasattr(ort, 'preload_dlls') else 'absent'}")
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s %(levelname)s %(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiny.onnx"
        tiny_model(path)
        runtime = OnnxRuntime(path, device="auto")
        print(f"rlserve OnnxRuntime(device=auto).describe(): {runtime.describe()}")
        options = runtime._session.get_provider_options()  # noqa: SLF001 (a report)
        print(f"provider options: {options}")
        model = onnx.load(str(path))
        w, b = (onnx.numpy_helper.to_array(t) for t in model.graph.initializer)
        for rows in (1, 64, 1000):
            obs = np.random.default_rng(rows).standard_normal((rows, 64)).astype(np.float32)
            got = runtime.run({"obs": obs})["dist_inputs"]
            exact = obs.astype(np.float64) @ w + b
            print(f"  {rows:>4} rows: max |diff| vs float64 numpy {np.abs(got - exact).max():.3g}")
        staging = runtime.staging
        print(f"staging: {None if staging is None else (staging.kind, staging.allocations, staging.nbytes())}")
        return runtime.device.startswith("cuda")


def main() -> int:
    part("driver", driver)
    part("python and packages", packages)
    # ONNX Runtime first: before torch is imported (torch loads the CUDA libraries itself),
    # as in a server that serves ONNX bundles and never imports torch.
    onnx_ok = part("onnxruntime on CUDA (rlserve's runtime, torch not imported)", onnx_cuda)
    torch_ok = part("torch on CUDA", torch_cuda)
    print(f"\nRAN ON CUDA: onnxruntime {'yes' if onnx_ok else 'NO'}; torch {'yes' if torch_ok else 'NO'}", flush=True)
    return 0 if onnx_ok else 1


if __name__ == "__main__":
    sys.exit(main())
