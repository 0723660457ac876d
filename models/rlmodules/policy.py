"""A default RLModule behind the uniform policy contract (``models/interface.py``).

    forward(obs, *state_in, [prev_actions (B, n, A)], [prev_rewards (B, m)])
        -> (dist_inputs, value, *state_out)

``obs`` is what the bundle's server-side connectors made of the raw observation; the
``ConnectorGraph`` adds what the session keeps (previous actions and rewards, frames), then
the module runs one step. The state is the module's (its LSTM's ``h``/``c``, per actor and
critic where they are separate, each ``(1, cell)`` per row as RLlib keeps them) followed by
the frame stack, all zeros at an episode start (RLlib's initial state and fill).
The module's own parameters sit under ``module.`` with RLlib's names.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from rlserve.models.interface import ModelSignature, PrevSpec, StateSpec
from rlserve.models.rlmodules.graph import ConnectorGraph
from rlserve.models.rlmodules.modules import RLModuleNet

__all__ = ["RLModulePolicy"]


class RLModulePolicy(nn.Module):
    rllib_prefix_map = {"module.": ""}

    def __init__(self, module: RLModuleNet, graph: ConnectorGraph, obs_shape: Sequence[int], num_outputs: int,
                 action_width: int):
        super().__init__()
        self.module = module
        self._state_specs = module.state_specs
        # Not named ``graph``: an exported GraphModule has an attribute of that name.
        self.connectors = graph
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.num_outputs = int(num_outputs)
        self.action_width = int(action_width)
        self._module_states = len(self._state_specs)

    def signature(self) -> ModelSignature:
        states = [StateSpec(name, tuple(shape)) for name, shape in self._state_specs]
        frames = self.connectors.frame_state_shape
        if frames is not None:
            states.append(StateSpec("frames", frames))
        graph = self.connectors
        prev = PrevSpec(graph.n_prev_actions, graph.n_prev_rewards,
                        self.action_width if graph.n_prev_actions else 0, windowed=True)
        return ModelSignature(obs_shape=self.obs_shape, num_outputs=self.num_outputs, state=tuple(states), prev=prev)

    def forward(self, obs: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
        graph = self.connectors
        n_states = self._module_states + (graph.frame_state_shape is not None)
        states, prev = list(rest[:n_states]), list(rest[n_states:])
        frames = states.pop() if graph.frame_state_shape is not None else None
        prev_actions = prev.pop(0) if graph.n_prev_actions else None
        prev_rewards = prev.pop(0) if graph.n_prev_rewards else None
        if prev:
            raise ValueError(f"RLModulePolicy: {len(prev)} unexpected inputs")
        module_obs, frames_out = graph(obs, frames, prev_actions, prev_rewards)
        dist_inputs, value, states_out = self.module(module_obs, states)
        outputs = [dist_inputs, value, *states_out]
        if frames_out is not None:
            outputs.append(frames_out)
        return tuple(outputs)
