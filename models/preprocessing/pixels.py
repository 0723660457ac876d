"""RLlib's GenericPixelPreprocessor for (210, 160, 3) frames, without OpenCV.

Steps, as RLlib 2.60 does them: crop rows ``[25:-25]`` to (160, 160, 3); if ``dim < 84``
area-resize to 84x84 first; area-resize to ``dim`` x ``dim`` (``cv2.INTER_AREA``, see
``resize.py``); then

- grayscale: ``mean`` over channels (float64) cast to float32, shape (dim, dim, 1);
  ``zero_mean``: ``(x - 128) / 128``, else ``x * float32(1/255)`` (float32 either way);
- colour, ``zero_mean`` on a uint8 frame: ``x - 128`` is computed **in uint8, so it
  wraps**, then divided by 128 in float64: the output is ``((x - 128) mod 256) / 128``
  in [0, 2). This is RLlib's recorded behaviour and is reproduced on purpose;
- colour without ``zero_mean``: RLlib crashes (an in-place float multiply on the uint8
  resize output, see oracle SKIPPED.md). We return what that code meant:
  ``float32(x) * float32(1/255)``, float32 in [0, 1].

Float frames (float32/float64 Box of that shape) take the same steps in float, without
the uint8 wrap. Other dtypes are rejected when the preprocessor is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces as gs

from rlserve.models.preprocessing.leaves import LeafPreprocessor
from rlserve.models.preprocessing.resize import resize_area

__all__ = ["ATARI_OBS_SHAPE", "GenericPixelPreprocessor"]

ATARI_OBS_SHAPE = (210, 160, 3)
_CROP = 25
_MIPMAP_DIM = 84  # RLlib resizes to 84 first when the target is smaller
_CROPPED = ATARI_OBS_SHAPE[1]  # the crop leaves a (160, 160) frame


class GenericPixelPreprocessor(LeafPreprocessor):
    rllib_name = "GenericPixelPreprocessor"

    def __init__(self, space: gs.Space, options: Mapping[str, Any]):
        super().__init__(space, options)
        self._dim = int(options["dim"])
        self._gray = bool(options["grayscale"])
        self._zero_mean = bool(options["zero_mean"])
        self._in_dtype = np.dtype(space.dtype)
        if self._in_dtype not in (np.uint8, np.float32, np.float64):
            raise ValueError(
                f"GenericPixelPreprocessor: a {ATARI_OBS_SHAPE} observation space must be uint8, "
                f"float32 or float64, got {self._in_dtype.name}"
            )
        if not 1 <= self._dim <= _CROPPED:
            raise ValueError(
                f"model config 'dim': expected 1..{_CROPPED} for {ATARI_OBS_SHAPE} frames, got {self._dim}"
            )
        self.output_shape = (self._dim, self._dim, 1 if self._gray else 3)
        self.output_dtype = self._choose_dtype()

    def _choose_dtype(self) -> np.dtype:
        if self._gray or not self._zero_mean:
            return np.dtype(np.float32)
        # Colour zero_mean divides the resized frame by 128: uint8 -> float64, floats keep theirs.
        return np.dtype(np.float64) if self._in_dtype == np.uint8 else self._in_dtype

    def _resize(self, frames: np.ndarray) -> np.ndarray:
        cropped = frames[:, _CROP:-_CROP].astype(self._in_dtype, copy=False)
        if self._dim < _MIPMAP_DIM:
            cropped = resize_area(cropped, _MIPMAP_DIM, _MIPMAP_DIM)
        return resize_area(cropped, self._dim, self._dim)

    def _compute(self, raw: np.ndarray) -> np.ndarray:
        scaled = self._resize(raw)
        if self._gray:
            gray = scaled.mean(axis=3).astype(np.float32)[..., None]
            out = (gray - 128) / 128 if self._zero_mean else gray * np.float32(1.0 / 255.0)
        elif self._zero_mean:
            if scaled.dtype == np.uint8:
                out = (scaled - np.uint8(128)) / 128.0  # wraps in uint8, like RLlib
            else:
                out = (scaled - 128) / 128
        else:
            out = scaled.astype(np.float32) * np.float32(1.0 / 255.0)
        return out.reshape(len(raw), -1)
