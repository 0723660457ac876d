"""OpenCV's ``cv2.resize(img, (w, h), interpolation=cv2.INTER_AREA)`` for downscaling, in numpy.

RLlib's GenericPixelPreprocessor resizes uint8 frames with OpenCV. OpenCV is not a runtime
dependency here, so this module reproduces its arithmetic bit for bit on uint8 images:

- same size: a copy;
- integer factor 2 in both axes: ``(a + b + c + d + 2) >> 2`` (OpenCV's 2x2 fast path);
- other integer factors: the integer block sum times ``float32(1/area)``, rounded half to even;
- otherwise: OpenCV's separable area table. Each destination pixel is a weighted sum of
  the source pixels its cell overlaps; weights are float32, the horizontal pass
  accumulates in float32 in table order, then the vertical pass does the same, and the
  result is rounded half to even and saturated to [0, 255].

Float images take the same area weights in float64 (OpenCV's float rounding order is not
reproduced; the difference is far below the conformance tolerance).
Only downscaling (or same size) is supported: upscaling with INTER_AREA is a different
algorithm that RLlib never reaches for the (160, 160) crop unless ``dim > 160``.

Shapes: ``images`` is ``(N, H, W, C)``; the result is ``(N, h, w, C)`` with the input dtype.
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["resize_area"]

_EPS = 1e-3  # OpenCV's tolerance for a partial source pixel at a cell edge


@functools.cache
def _area_table(src: int, dst: int) -> tuple[np.ndarray, np.ndarray]:
    """Per destination index: source indices and float32 weights, in OpenCV's order.

    Returned as dense ``(dst, K)`` arrays padded with index 0 and weight 0 at the end;
    adding ``0 * x`` leaves a float sum unchanged, so padding keeps the result exact.
    """
    scale = 1.0 / (dst / src)  # OpenCV computes the inverse scale first, then inverts it
    rows: list[list[tuple[int, np.float32]]] = []
    for d in range(dst):
        f1 = d * scale
        f2 = f1 + scale
        cell = min(scale, src - f1)
        s2 = min(int(np.floor(f2)), src - 1)
        s1 = min(int(np.ceil(f1)), s2)
        entries = []
        if s1 - f1 > _EPS:
            entries.append((s1 - 1, np.float32((s1 - f1) / cell)))
        entries.extend((s, np.float32(1.0 / cell)) for s in range(s1, s2))
        if f2 - s2 > _EPS:
            entries.append((s2, np.float32(min(min(f2 - s2, 1.0), cell) / cell)))
        rows.append(entries)
    width = max(len(r) for r in rows)
    index = np.zeros((dst, width), dtype=np.intp)
    weight = np.zeros((dst, width), dtype=np.float32)
    for d, entries in enumerate(rows):
        for k, (s, w) in enumerate(entries):
            index[d, k] = s
            weight[d, k] = w
    return index, weight


def _integer_factor(src: int, dst: int) -> int | None:
    scale = 1.0 / (dst / src)
    factor = int(round(scale))
    return factor if abs(scale - factor) < np.finfo(np.float64).eps else None


def _weighted_pass(images: np.ndarray, axis: int, src: int, dst: int, work: type) -> np.ndarray:
    """Accumulate ``sum_k w_k * x[idx_k]`` along ``axis`` in ``work`` precision, table order."""
    index, weight = _area_table(src, dst)
    weight = weight.astype(work)
    shape = [1] * images.ndim
    shape[axis] = dst
    acc = None
    for k in range(index.shape[1]):
        term = np.take(images, index[:, k], axis=axis).astype(work, copy=False) * weight[:, k].reshape(shape)
        acc = term if acc is None else acc + term
    assert acc is not None
    return acc


def _block_uint8(images: np.ndarray, fy: int, fx: int) -> np.ndarray:
    n, h, w, c = images.shape
    blocks = images.reshape(n, h // fy, fy, w // fx, fx, c).astype(np.int32)
    total = blocks.sum(axis=(2, 4))
    if fy == 2 and fx == 2 and c in (1, 3, 4):
        return ((total + 2) >> 2).astype(np.uint8)
    scaled = total.astype(np.float32) * np.float32(1.0 / (fx * fy))
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)


def resize_area(images: np.ndarray, height: int, width: int) -> np.ndarray:
    """Area-downscale ``(N, H, W, C)`` images to ``(N, height, width, C)`` like OpenCV."""
    n, h, w, c = images.shape
    if height > h or width > w:
        raise ValueError(f"resize_area only downscales: ({h}, {w}) -> ({height}, {width})")
    if (height, width) == (h, w):
        return images.copy()
    is_uint8 = images.dtype == np.uint8
    fy, fx = _integer_factor(h, height), _integer_factor(w, width)
    if is_uint8 and fy is not None and fx is not None:
        return _block_uint8(images, fy, fx)
    work = np.float32 if is_uint8 else np.float64
    # OpenCV runs the horizontal pass per source row, then combines rows vertically.
    horizontal = _weighted_pass(images, 2, w, width, work)
    both = _weighted_pass(horizontal, 1, h, height, work)
    if is_uint8:
        return np.clip(np.rint(both), 0, 255).astype(np.uint8)
    return both.astype(images.dtype)
