"""Refuse a GPU image whose ONNX Runtime CUDA provider could not load its libraries.

Run at build time by docker/Dockerfile.gpu, where there is no GPU and no driver. It checks
what can be checked without them:

1. exactly one ONNX Runtime distribution, ``onnxruntime-gpu``, with ``CUDAExecutionProvider``
   compiled in;
2. ``onnxruntime.preload_dlls()`` loads every CUDA and cuDNN library of the ``nvidia-*``
   wheels it asks for (what rlserve calls before the first CUDA session), by the file names
   ONNX Runtime's build wants;
3. every library the CUDA provider links (its ELF ``NEEDED`` entries, found by ``ldd`` in the
   nvidia-* library folders) resolves, except ``libcuda.so.1``: that one is the driver's, put
   in the container at run time by the NVIDIA container toolkit, so the provider itself
   cannot be opened here, and its first session is the run-time proof (docs/container.md);
4. cuDNN's own libraries resolve the same way (the CUDA provider opens libcudnn.so.9 at run time).

Prints what it found; exits 1 naming what is missing.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as metadata
import io
import subprocess
import sys
from pathlib import Path

DRIVER = "libcuda.so.1"


def loaded_libraries() -> set[str]:
    maps = Path("/proc/self/maps").read_text().splitlines()
    return {Path(line.split()[-1]).name for line in maps if ".so" in line}


def unresolved(library: Path, folders: list[Path]) -> list[str]:
    env = {"LD_LIBRARY_PATH": ":".join(str(f) for f in folders), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(["ldd", str(library)], capture_output=True, text=True, env=env, check=False).stdout
    return [line.split()[0] for line in out.splitlines() if "not found" in line and DRIVER not in line]


def main() -> int:
    problems: list[str] = []
    names = {d.metadata["Name"].lower() for d in metadata.distributions()}
    runtimes = sorted(n for n in names if n.startswith("onnxruntime"))
    if runtimes != ["onnxruntime-gpu"]:
        problems.append(f"expected onnxruntime-gpu alone, found {runtimes}")
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        problems.append(f"CUDAExecutionProvider is not compiled in: {ort.get_available_providers()}")
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        ort.preload_dlls()
    failures = [line for line in said.getvalue().splitlines() if line.startswith("Failed to load")]
    problems += failures
    loaded = loaded_libraries()
    wanted = ["libcublasLt.so.13", "libcublas.so.13", "libcudart.so.13", "libcurand.so.10", "libcudnn.so.9"]
    problems += [f"{name} is not loaded after preload_dlls()" for name in wanted if name not in loaded]
    site = Path(ort.__file__).resolve().parents[1]
    folders = sorted(p for p in (site / "nvidia").glob("*/lib") if p.is_dir())
    provider = Path(ort.__file__).parent / "capi" / "libonnxruntime_providers_cuda.so"
    cudnn = [p for f in folders for p in f.glob("libcudnn*.so.9")]
    for library in [provider, *cudnn]:
        problems += [f"{library.name} links {name}, which is not installed" for name in unresolved(library, folders)]
    print(f"onnxruntime-gpu {ort.__version__}; nvidia library folders: {[str(f) for f in folders]}")
    stems = {name.split(".so")[0] for name in wanted}
    print(f"loaded by preload_dlls: {sorted(n for n in loaded if n.split('.so')[0] in stems)}")
    print(f"checked {1 + len(cudnn)} libraries with ldd; {DRIVER} comes from the driver at run time")
    if problems:
        print("the CUDA provider could not load its libraries:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print("CUDA provider libraries: all present")
    return 0


if __name__ == "__main__":
    sys.exit(main())
