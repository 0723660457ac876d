"""The batcher's limits for one model: the settings, with other defaults on a GPU.

A GPU call costs a roughly fixed launch-and-copy overhead (~0.1-0.3 ms) whatever its
rows, and a thousand rows more cost it little, so a GPU wants fewer, larger batches than
the CPU defaults make; and its call waits on the device, which a worker thread can do
while the event loop parses the next requests. A setting the user gave (environment or
command line) is kept as given; only the defaults change.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlserve.service.settings import Settings

# Setting name -> its default when the model runs on CUDA.
GPU_DEFAULTS: dict[str, float | int] = {
    "max_batch_size": 4096,  # rows per call: four 1,024-row requests
    # A short window: while a batch runs on the device the next one queues anyway; the
    # window only gathers requests that arrive together when the device is idle.
    "max_batch_delay_ms": 0.2,
    "queue_limit": 16384,  # four full batches waiting
    "inline_batch_rows": 0,  # every batch waits for the device in the batcher's thread
}


@dataclass(frozen=True)
class BatchLimits:
    max_rows: int
    max_delay_s: float
    queue_limit: int
    inline_rows: int


def batch_limits(settings: Settings, device: str) -> BatchLimits:
    """The limits for a model on ``device`` (``cpu``, ``cuda:N``)."""
    values: dict[str, float | int] = {name: getattr(settings, name) for name in GPU_DEFAULTS}
    if device.startswith("cuda"):
        values.update({name: default for name, default in GPU_DEFAULTS.items()
                       if name not in settings.model_fields_set})
    return BatchLimits(max_rows=int(values["max_batch_size"]), max_delay_s=float(values["max_batch_delay_ms"]) / 1000.0,
                       queue_limit=int(values["queue_limit"]), inline_rows=int(values["inline_batch_rows"]))
