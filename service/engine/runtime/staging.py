"""Host buffers a GPU runtime copies each batch's inputs into, kept across batches.

A copy to the GPU from ordinary (pageable) memory goes through a driver bounce buffer and
holds the calling thread; from page-locked ("pinned") memory it is one DMA transfer. Pinning
costs a system call per allocation, so each input name keeps one block, grown to the next
power of two of bytes when a batch needs more and reused by every smaller batch.

The allocator is a parameter: ``cuda_host_allocator`` pins through the CUDA runtime the
process already loaded (ONNX Runtime's CUDA provider, or torch's), ``numpy_allocator``
is the pageable fallback, and tests pass their own.
"""

from __future__ import annotations

import ctypes
import logging
import math
import weakref
from collections.abc import Callable

import numpy as np

log = logging.getLogger("rlserve.runtime")

# nbytes -> a 1-D uint8 array of at least that many bytes, alive as long as the array is
Allocator = Callable[[int], np.ndarray]
MIN_BLOCK = 1 << 12  # a page: never pin less
# cudaHostAllocPortable: pinned for every CUDA context of the process, not only the
# current one (ONNX Runtime and torch may each hold their own).
_PORTABLE = 1
# The CUDA runtime, newest first: whichever the process's GPU runtime already loaded.
_CUDART_NAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")


def numpy_allocator(nbytes: int) -> np.ndarray:
    return np.empty(nbytes, dtype=np.uint8)


class HostStaging:
    """One reusable host block per input name; ``stage`` copies an array into its block."""

    def __init__(self, allocate: Allocator = numpy_allocator, kind: str = "pageable"):
        self._allocate = allocate
        self._blocks: dict[str, np.ndarray] = {}
        self.kind = kind  # "pinned" | "pageable", for describe() and the log
        self.allocations = 0  # blocks allocated so far (reuse means this stays put)

    def view(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A C-contiguous ``(shape, dtype)`` array over ``name``'s block (grown if needed).
        Its contents are whatever the last batch left there."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        block = self._blocks.get(name)
        if block is None or block.nbytes < nbytes:
            size = max(MIN_BLOCK, 1 << max(0, nbytes - 1).bit_length())
            block = self._allocate(size)
            self._blocks[name] = block  # the old block is freed with its last reference
            self.allocations += 1
        return block[:nbytes].view(dtype).reshape(shape)

    def stage(self, name: str, array: np.ndarray, dtype: np.dtype | None = None) -> np.ndarray:
        """A copy of ``array`` in ``name``'s block, as ``dtype`` (default its own)."""
        out = self.view(name, array.shape, array.dtype if dtype is None else dtype)
        np.copyto(out, array, casting="same_kind")
        return out

    def nbytes(self) -> int:
        return sum(block.nbytes for block in self._blocks.values())


def cuda_host_allocator() -> tuple[Allocator | None, str]:
    """(an allocator of pinned memory, "") through ``cudaHostAlloc`` of the CUDA runtime
    library the process has loaded, or (None, why not)."""
    cudart = None
    for name in _CUDART_NAMES:
        try:
            cudart = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if cudart is None:
        return None, f"no CUDA runtime library is loadable ({', '.join(_CUDART_NAMES)})"
    alloc, free = cudart.cudaHostAlloc, cudart.cudaFreeHost
    alloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
    free.argtypes = [ctypes.c_void_p]

    def allocate(nbytes: int) -> np.ndarray:
        ptr = ctypes.c_void_p()
        status = alloc(ctypes.byref(ptr), nbytes, _PORTABLE)
        if status != 0 or not ptr.value:
            raise MemoryError(f"cudaHostAlloc of {nbytes} bytes failed (CUDA error {status})")
        raw = (ctypes.c_uint8 * nbytes).from_address(ptr.value)
        # The array's base is ``raw``; when the last view of it goes, the memory goes back.
        weakref.finalize(raw, free, ptr.value)
        return np.frombuffer(memoryview(raw).cast("B"), dtype=np.uint8)

    try:  # one page, to know now (not at the first batch) that pinning works here
        allocate(MIN_BLOCK)
    except MemoryError as exc:
        return None, str(exc)
    return allocate, ""


def pinned_staging() -> HostStaging:
    """Staging in pinned memory where the CUDA runtime allows it, else pageable (logged)."""
    allocate, why = cuda_host_allocator()
    if allocate is None:
        log.warning("inputs are staged in pageable memory (slower copies to the GPU): %s", why)
        return HostStaging()
    return HostStaging(allocate, kind="pinned")
