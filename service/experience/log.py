"""The experience log of one server process: which models it records, and its writer.

Built from the settings at start (``RLSERVE_EXPERIENCE_LOG``); every model version the
registry adds is attached (``attach``): its preparer keeps the observations as received
and its batch step gets a ``Recorder``. One writer thread serves every model.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from rlserve.service.experience import files
from rlserve.service.experience.event_ids import never_given
from rlserve.service.experience.recorder import Recorder
from rlserve.service.experience.records import ModelLog, RewardEvent
from rlserve.service.experience.writer import ExperienceWriter

log = logging.getLogger("rlserve.experience")

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def folder_name(model: str) -> str:
    """A model's folder under the log root: its name, with characters a path could
    misread (``/``, ``..``) spelled as ``%XX``."""
    name = _UNSAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), model)
    return "%2E" + name[1:] if name.startswith(".") else name


class ExperienceLog:
    def __init__(self, root: Path, *, sample: float = 1.0, models: dict[str, float] | None = None,
                 metrics: Any = None, **writer_options: Any):
        # pyarrow now, not at the first write: it takes a second or more to import, and its
        # thousands of objects are then in place when `rlserve serve` moves everything loaded
        # at start out of the garbage collector's view (gc.freeze), instead of being scanned
        # by every full collection while the server runs.
        files.load_parquet()  # first: it picks pyarrow's allocator before pyarrow is imported
        from rlserve.service.experience import tables  # noqa: F401

        self.root = root
        self.sample = sample
        self.models = dict(models or {})
        self.writer = ExperienceWriter(root, metrics=metrics, **writer_options)
        self._logs: dict[str, ModelLog] = {}

    @classmethod
    def from_settings(cls, settings: Any, metrics: Any = None) -> ExperienceLog | None:
        if settings.experience_log is None:
            return None
        return cls(settings.experience_log, sample=settings.experience_sample, models=settings.experience_models,
                   metrics=metrics, queue_rows=settings.experience_queue_rows, roll_s=settings.experience_roll_s,
                   roll_bytes=settings.experience_roll_bytes, flush_s=settings.experience_flush_s)

    def rate(self, model: str) -> float:
        """The fraction of ``model``'s episodes logged (0: none)."""
        if self.models:
            return self.models.get(model, 0.0)
        return self.sample

    def model_log(self, name: str, obs_space: Any = None, action_space: Any = None) -> ModelLog | None:
        """The model's part of the log (None for a model never attached and no spaces given)."""
        model = self._logs.get(name)
        if model is None and obs_space is not None:
            model = self._logs[name] = ModelLog(name, obs_space, action_space, self.root / folder_name(name))
        return model

    def attach(self, policy: Any) -> None:
        """Record ``policy``'s session steps, if its model is logged."""
        rate = self.rate(policy.name)
        if rate <= 0.0:
            return
        pipeline = policy.pipeline
        model = self.model_log(policy.name, pipeline.obs_space, pipeline.action_space)
        assert model is not None
        policy.preparer.keep_raw = True
        policy.step.recorder = Recorder(model, self.writer, version=policy.version, rate=rate,
                                        env_actions=policy.step.env_actions)
        log.info("experience log: recording %s (%.0f%% of episodes) under %s", policy.key, 100 * rate,
                 model.directory)

    def rewards(self, name: str, events: list[RewardEvent]) -> bool:
        """Queue delayed rewards of ``name``'s logged steps; False when the queue dropped them.
        Those whose event id no answer can have carried are written too, and counted."""
        model = self.model_log(name)
        if model is None or not self.writer.offer_rewards(model, events):
            return False
        unmatched = sum(never_given(event.event_id) for event in events)
        if unmatched and self.writer.metrics is not None:
            self.writer.metrics.experience_rewards_unmatched(unmatched)
        return True

    def close(self, timeout: float | None = 30.0) -> None:
        self.writer.close(timeout)
