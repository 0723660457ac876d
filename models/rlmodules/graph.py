"""The graph stages of a new-stack connector pipeline, in torch (``connectors/plan.py`` says which).

``ConnectorGraph(stages)`` turns the model's ``obs`` input (what the server stages made of
the raw observation) plus what the session keeps into the module's input, as RLlib's
connectors build it from the episode:

- ``PrevActionsPrevRewards`` + ``FlattenObservations``: ``[obs, one-hot action[t-n] ...
  action[t-1], reward[t-m] ... reward[t-1]]`` (the Dict keys ``_orig_obs`` <
  ``prev_n_actions`` < ``prev_n_rewards`` sorted, minus ``keys_to_remove``). The session
  keeps the actions one-hot, so the zero rows before the episode's first actions are
  RLlib's zero padding (not one-hot of action 0).
- a ``MeanStdFilter`` after them: ``clip((x - mean) / (std + 1e-6))`` in float64, as numpy.
- ``FrameStacking``: the last ``num_frames`` frames concatenated along the last axis, zeros
  before the episode start; the previous ``num_frames - 1`` frames are a state of the
  model (``frames``) that it returns shifted by one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from rlserve.models.filters import SMALL_NUMBER, MeanStdFilter

__all__ = ["ConnectorGraph"]


class _GraphFilter(nn.Module):
    mean: torch.Tensor
    denom: torch.Tensor

    def __init__(self, state: Mapping[str, Any]):
        super().__init__()
        filt = MeanStdFilter.from_state(state)
        # numpy's arithmetic: float64 input minus the float64 mean, over the float32 std + 1e-6.
        denom = (filt.std + np.float32(SMALL_NUMBER)).astype(np.float64) if filt.destd else None
        self.register_buffer("mean", torch.from_numpy(filt.mean_array.astype(np.float64) if filt.demean
                                                      else np.zeros(filt.shape)))
        self.register_buffer("denom", torch.from_numpy(denom if denom is not None else np.ones(filt.shape)))
        self.clip = filt.clip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = (x.to(torch.float64) - self.mean) / self.denom
        if self.clip is not None:
            y = torch.clamp(y, -self.clip, self.clip)
        return y.to(torch.float32)


class ConnectorGraph(nn.Module):
    def __init__(self, stages: Sequence[Mapping[str, Any]]):
        super().__init__()
        names = [s["class"] for s in stages]
        prev = next((s for s in stages if s["class"] == "PrevActionsPrevRewards"), None)
        self.n_prev_actions = int(prev["n_prev_actions"]) if prev else 0
        self.n_prev_rewards = int(prev["n_prev_rewards"]) if prev else 0
        self.uses_prev = prev is not None
        flatten = next((s for s in stages if s["class"] == "FlattenObservations"), None)
        self.keys = list(flatten["keys"]) if flatten else []
        filters = [s for s in stages if s["class"] == "MeanStdFilter"]
        self.mean_std = _GraphFilter(filters[0]["filter"]) if filters else None
        frames = next((s for s in stages if s["class"] == "FrameStacking"), None)
        self.num_frames = int(frames["num_frames"]) if frames else 0
        self.frame_shape = tuple(int(d) for d in frames["frame_shape"]) if frames else ()
        unknown = set(names) - {"PrevActionsPrevRewards", "FlattenObservations", "MeanStdFilter", "FrameStacking"}
        if unknown or len(filters) > 1:
            raise ValueError(f"connector graph: cannot run stages {names}")

    @property
    def frame_state_shape(self) -> tuple[int, ...] | None:
        """Per row, the previous frames kept as state; None without frame stacking (or one frame)."""
        if self.num_frames <= 1:
            return None
        return (*self.frame_shape[:-1], self.frame_shape[-1] * (self.num_frames - 1))

    def forward(self, obs: torch.Tensor, frames: torch.Tensor | None, prev_actions: torch.Tensor | None,
                prev_rewards: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = obs
        if self.uses_prev:
            parts = {"_orig_obs": obs}
            if prev_actions is not None:
                parts["prev_n_actions"] = prev_actions.reshape(obs.shape[0], -1)
            if prev_rewards is not None:
                parts["prev_n_rewards"] = prev_rewards.reshape(obs.shape[0], -1)
            x = torch.cat([parts[k] for k in self.keys if k in parts], dim=1)
        if self.mean_std is not None:
            x = self.mean_std(x)
        frames_out = None
        if frames is not None:
            stacked = torch.cat([frames, x], dim=-1)
            frames_out = stacked[..., self.frame_shape[-1]:]
            x = stacked
        return x, frames_out
