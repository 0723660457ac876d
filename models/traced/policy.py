"""A restored RLModule behind the uniform policy contract, ready to be traced (torch).

    forward(obs, *state_in, [prev_actions], [prev_rewards]) -> (dist_inputs, value, *state_out)

per step, as a session's batch reaches the runtime:

1. the connector stages of the graph (previous actions and rewards, frame stacks:
   ``rlmodules/graph.py``, the same ones a default module's bundle runs) make the module's
   observation from the server's row; a module that reads a Dict/Tuple observation gets it
   rebuilt (``ObsLayout``);
2. the batch RLlib's EnvRunner hands the module: ``{"obs": ...}``, and for a stateful module
   a time axis of 1 on the observation and ``state_in`` nested as ``get_initial_state()``;
3. ``forward_inference`` (through the MultiRLModule where there is one); its
   ``action_dist_inputs`` (the time axis removed), through the distribution's constructor
   where it is served that way (``dists.py``); ``state_out`` flattened;
4. ``compute_values`` on a fresh copy of the batch where the module has a value function,
   else NaN rows (the answer's value is null).

Each call builds its batch anew: modules may edit the batch they are given (RLlib's
action-masking example pops the mask out of it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from rlserve.models.interface import ModelSignature, PrevSpec, StateSpec
from rlserve.models.rlmodules.graph import ConnectorGraph
from rlserve.models.traced.dists import ServedDist
from rlserve.models.traced.layout import ObsLayout, StateLayout
from rlserve.models.traced.loader import LoadedModule

__all__ = ["TracedModulePolicy"]

DIST_INPUTS = "action_dist_inputs"
STATE_OUT = "state_out"


def _time_axis(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _time_axis(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return type(value)(_time_axis(v) for v in value)
    return value.unsqueeze(1)


class TracedModulePolicy(nn.Module):
    def __init__(self, loaded: LoadedModule, graph: ConnectorGraph, obs_shape: Sequence[int], state: StateLayout,
                 dist: ServedDist, obs_layout: ObsLayout | None, *, stateful: bool, has_value: bool,
                 action_width: int):
        super().__init__()
        # Registered: their parameters are the bundle's weights.
        self.modules_read = nn.ModuleDict(loaded.torch_modules())
        self._loaded = loaded
        self.connectors = graph
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self._state = state
        for i, offset in enumerate(state.offsets()):
            self.register_buffer(f"state_offset_{i}", offset, persistent=False)
        self._dist = dist
        self._obs_layout = obs_layout
        self.stateful = bool(stateful)
        self.has_value = bool(has_value)
        self.action_width = int(action_width)

    @property
    def dist(self) -> ServedDist:
        return self._dist

    @property
    def module_states(self) -> int:
        """How many of the state inputs are the module's (a frame stack may follow them)."""
        return len(self._state)

    def signature(self) -> ModelSignature:
        states = [StateSpec(self._state.name(i), shape, initial_value=fill if fill is not None else 0.0)
                  for i, (shape, fill) in enumerate(zip(self._state.shapes, self._state.fills, strict=True))]
        graph = self.connectors
        if graph.frame_state_shape is not None:
            states.append(StateSpec("frames", graph.frame_state_shape))
        prev = PrevSpec(graph.n_prev_actions, graph.n_prev_rewards,
                        self.action_width if graph.n_prev_actions else 0, windowed=True)
        return ModelSignature(obs_shape=self.obs_shape, num_outputs=self._dist.spec.num_outputs, state=tuple(states),
                              prev=prev)

    def _offset(self, i: int) -> torch.Tensor | None:
        return getattr(self, f"state_offset_{i}", None)

    def batch(self, obs: torch.Tensor, states: list[torch.Tensor]) -> dict[str, Any]:
        module_obs: Any = self._obs_layout.unflatten(obs) if self._obs_layout is not None else obs
        if not self.stateful:
            return {"obs": module_obs}
        return {"obs": _time_axis(module_obs), "state_in": self._state.nest(states)}

    def forward(self, obs: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
        graph = self.connectors
        n_module = len(self._state)
        n_states = n_module + (graph.frame_state_shape is not None)
        states, prev = list(rest[:n_states]), list(rest[n_states:])
        frames = states.pop() if graph.frame_state_shape is not None else None
        prev_actions = prev.pop(0) if graph.n_prev_actions else None
        prev_rewards = prev.pop(0) if graph.n_prev_rewards else None
        module_obs, frames_out = graph(obs, frames, prev_actions, prev_rewards)
        for i in range(n_module):  # the session keeps a state's difference from its initial value
            offset = self._offset(i)
            if offset is not None:
                states[i] = states[i] + offset
        out = self._loaded.forward("forward_inference", self.batch(module_obs, states))
        dist_inputs = out[DIST_INPUTS]
        if self.stateful:
            dist_inputs = dist_inputs.squeeze(1)
        if self._dist.fold is not None:
            dist_inputs = self._dist.fold(dist_inputs.clone())
        value = self._value(module_obs, states, dist_inputs)
        outputs = [dist_inputs, value]
        if n_module:
            for i, tensor in enumerate(self._state.flatten(out[STATE_OUT])):
                offset = self._offset(i)
                outputs.append(tensor - offset if offset is not None else tensor)
        if frames_out is not None:
            outputs.append(frames_out)
        return tuple(outputs)

    def _value(self, module_obs: torch.Tensor, states: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        if not self.has_value:
            return like.new_full((like.shape[0],), float("nan"))
        value = self._loaded.member.compute_values(self.batch(module_obs, states))
        return value.reshape(like.shape[0])
