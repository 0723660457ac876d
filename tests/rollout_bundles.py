"""Two versions of the embedded CartPole policy for the rollout tests and docs: version 1
as shipped, and a deliberately worse version 2, the same network behind an observation
filter that shifts the pole angle it sees (``degraded_copy``)."""

from __future__ import annotations

import shutil
from pathlib import Path

from bundle_edits import edited_copy

from rlserve.service.app import DEFAULT_MODELS

MODEL = "cartpole"
ANGLE_SHIFT = 0.3  # radians added to the pole angle the version-2 network sees


def degraded_copy(out: Path) -> Path:
    """The embedded ``cartpole`` as version 2 behind a filter that subtracts a mean of
    ``-ANGLE_SHIFT`` from the pole angle (std 1): the network sees the pole leaning."""
    def edit(data: dict) -> None:
        data["filter"] = {"type": "MeanStdFilter", "shape": [4], "demean": True, "destd": False, "clip": None,
                          "num_pushes": 2, "mean": [0.0, 0.0, -ANGLE_SHIFT, -3 * ANGLE_SHIFT], "sum_sq_diff": [1.0] * 4}

    return edited_copy(DEFAULT_MODELS / MODEL, out, edit)


def two_versions(parent: Path) -> Path:
    """A repository under ``parent`` with ``cartpole`` version 1 and its degraded version 2."""
    repo = parent / "models"
    repo.mkdir()
    shutil.copytree(DEFAULT_MODELS / MODEL, repo / "cartpole-1")
    degraded_copy(repo / "cartpole-2")
    return repo
