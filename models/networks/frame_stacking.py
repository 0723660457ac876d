"""RLlib's example ``TorchFrameStackingCartPoleModel`` (``trajectory_view_utilizing_models.py``).

RLlib's view requirements: ``prev_n_obs`` = obs at shifts ``-(n-1)..0`` (the current one
last), ``prev_n_actions`` and ``prev_n_rewards`` = shifts ``-n..-1``. RLlib's sampler
(``AgentCollector``) pads the obs window at an episode start with copies of the episode's
*first observation*, and the action and reward windows with zeros.

In the graph (``models/interface.py`` contract):

    inputs : obs (B, D), state_in_0 = the last n-1 observations (B, n-1, D),
             state_in_1 = started flag (B, 1) (0 at an episode start),
             prev_actions (B, n, 1) action indices, prev_rewards (B, n)
    outputs: logits, value, state_out_0 = the last n-1 observations now, state_out_1 = ones

The obs window is session state: at an episode start (flag 0) the graph takes the current
observation for every earlier slot, ``window*flag + obs*(1-flag)`` (exact for a 0/1 flag);
the action and reward windows are the server's zero-padded windows of reported actions
and rewards, the same as the attention wrapper's.

    cat(frames (B, n*D), one_hot(actions) (B, n*A), rewards (B, n))
        -> layer1 (256, relu) -> layer2 (256, relu) -> out (linear) ; values (linear) from layer2
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium.spaces as gs
import numpy as np
import torch

from rlserve.models.interface import ModelSignature, PrevSpec, StateSpec
from rlserve.models.networks.common import SlimFC
from rlserve.models.networks.custom_policy import RecurrentCustomModel
from rlserve.models.networks.wrapper_inputs import PrevActionEncoder

RLLIB_PATHS = (
    "ray.rllib.examples._old_api_stack.models.trajectory_view_utilizing_models.TorchFrameStackingCartPoleModel",
    "ray.rllib.examples.models.trajectory_view_utilizing_models.TorchFrameStackingCartPoleModel",
)
HIDDEN = 256  # fixed in RLlib's example


class TorchFrameStackingCartPoleModel(RecurrentCustomModel):
    rllib_class_name = "TorchFrameStackingCartPoleModel"

    def __init__(
        self,
        obs_space: Any,
        action_space: gs.Space,
        num_outputs: int | None,
        model_config: Mapping[str, Any],
        name: str = "frame_stacking",
        num_frames: int = 3,
        **unused: Any,
    ) -> None:
        super().__init__()
        if not isinstance(num_frames, int) or isinstance(num_frames, bool) or num_frames < 2:
            raise ValueError(
                f"model_config.custom_model_config.num_frames: expected an int >= 2, received {num_frames!r}"
            )
        if not isinstance(action_space, gs.Discrete):
            raise ValueError(
                f"frame-stacking model: expected a Discrete action space, got {type(action_space).__name__}"
            )
        if len(getattr(obs_space, "shape", ()) or ()) != 1:
            raise ValueError(f"frame-stacking model: expected a 1-D observation, got shape {obs_space.shape}")
        if not num_outputs:
            raise ValueError("frame-stacking model: needs num_outputs (it cannot be wrapped)")
        self.num_frames = num_frames
        self.obs_shape = (int(obs_space.shape[0]),)
        self.num_outputs = int(num_outputs)
        self.action_encoder = PrevActionEncoder(action_space)
        in_size = num_frames * (self.obs_shape[0] + self.action_encoder.out_width + 1)
        self.layer1 = SlimFC(in_size, HIDDEN, activation="relu")
        self.layer2 = SlimFC(HIDDEN, HIDDEN, activation="relu")
        self.out = SlimFC(HIDDEN, self.num_outputs)
        self.values = SlimFC(HIDDEN, 1)

    def initial_state(self) -> list[np.ndarray]:
        return [np.zeros((self.num_frames - 1, self.obs_shape[0]), np.float32), np.zeros((1,), np.float32)]

    def signature(self) -> ModelSignature:
        n = self.num_frames
        return ModelSignature(
            obs_shape=self.obs_shape,
            num_outputs=self.num_outputs,
            state=(StateSpec("obs_window", (n - 1, self.obs_shape[0])), StateSpec("obs_window_started", (1,))),
            prev=PrevSpec(n, n, self.action_encoder.in_width, windowed=True),
            views={
                # input: the graph input holding the window (the obs window without the current obs).
                "prev_n_obs": {"data_col": "obs", "shift": f"-{n - 1}:0", "padding": "first observation",
                               "input": "state_in_0", "started_input": "state_in_1"},
                "prev_n_actions": {"data_col": "actions", "shift": f"-{n}:-1", "padding": "zeros",
                                   "input": "prev_actions"},
                "prev_n_rewards": {"data_col": "rewards", "shift": f"-{n}:-1", "padding": "zeros",
                                   "input": "prev_rewards"},
            },
        )

    def frames(self, obs: torch.Tensor, window: torch.Tensor, started: torch.Tensor) -> torch.Tensor:
        """``prev_n_obs`` as RLlib builds it: ``(B, n, D)``, oldest first, padded by the first obs."""
        obs = obs.reshape(obs.shape[0], 1, -1).float()
        flag = started.reshape(-1, 1, 1)
        earlier = window * flag + obs * (1.0 - flag)
        return torch.cat([earlier, obs], dim=1)

    def forward_views(
        self, frames: torch.Tensor, prev_actions: torch.Tensor, prev_rewards: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """RLlib's forward on the three windows: frames (B,n,D), actions (B,n,1), rewards (B,n)."""
        rows = frames.shape[0]
        actions = self.action_encoder(prev_actions).reshape(rows, -1)
        x = torch.cat([frames.reshape(rows, -1), actions, prev_rewards.reshape(rows, -1).float()], dim=1)
        features = self.layer2(self.layer1(x))
        return self.out(features), self.values(features).reshape(-1)

    def forward(self, obs: torch.Tensor, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        window, started, prev_actions, prev_rewards = inputs
        frames = self.frames(obs, window, started)
        out, value = self.forward_views(frames, prev_actions, prev_rewards)
        return out, value, frames[:, 1:], torch.ones_like(started)
