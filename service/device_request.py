"""The ``RLSERVE_DEVICE`` setting parsed: which device a runtime is asked for.

The settings validate the value with it and the engine's runtimes place a model by it
(``rlserve.service.engine.runtime.device``); it sits below both, so reading the settings
never imports the engine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N (N the CUDA device index)"
_DEVICE = re.compile(r"^(auto|cpu|cuda)(?::(\d+))?$")


@dataclass(frozen=True)
class DeviceRequest:
    """The parsed setting: ``kind`` and, for CUDA, the device index (0 unless ``cuda:N``)."""

    kind: Literal["auto", "cpu", "cuda"]
    index: int = 0

    @classmethod
    def parse(cls, text: str) -> DeviceRequest:
        match = _DEVICE.match(text.strip().lower())
        if match is None or (match.group(2) is not None and match.group(1) != "cuda"):
            raise ValueError(f"device {text!r}: expected {DEVICE_CHOICES}")
        kind: Literal["auto", "cpu", "cuda"] = match.group(1)  # type: ignore[assignment]  # the pattern's three
        return cls(kind, int(match.group(2) or 0))

    @property
    def required(self) -> bool:
        """CUDA was named explicitly: not having it is an error, not a fallback."""
        return self.kind == "cuda"

    def __str__(self) -> str:
        return f"cuda:{self.index}" if self.kind == "cuda" else self.kind
