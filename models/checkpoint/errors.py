"""The one error type of checkpoint reading (torch-free)."""

from __future__ import annotations


class CheckpointError(ValueError):
    """An RLlib checkpoint cannot be read or lacks what an export needs.

    The message names the file that holds (or should hold) what is missing.
    """
