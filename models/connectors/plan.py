"""Where each env-to-module connector of an RLlib pipeline runs when a bundle serves it (torch-free).

RLlib runs the user's connectors in list order on the newest observation of an episode.
A bundle splits that list in two, at the first connector that reads the episode's history:

- **server** stages (numpy, per request, in ``rlserve.models.connectors.stages``): the ones
  that only read the current observation: ``FlattenObservations`` and a frozen
  ``MeanStdFilter``. Their output is the model's ``obs`` input.
- **graph** stages (torch, exported into the model, fed by the session): from
  ``PrevActionsPrevRewards`` (the session's window of previous actions, one-hot, and
  rewards: the model's ``prev_actions``/``prev_rewards`` inputs) or ``FrameStacking`` (the
  previous frames: a state of the model) on. What may follow them is what RLlib allows
  there: after ``PrevActionsPrevRewards`` a ``FlattenObservations`` (required: RLlib's
  default modules cannot read its Dict) and then a ``MeanStdFilter``; ``FrameStacking``
  writes the batch itself, so it comes last.

``plan_connectors`` checks the chain against the spaces and the module's input and returns
a ``ConnectorLayout`` (JSON in the bundle manifest); anything else is refused by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces as gs

from rlserve.models.connectors.flatten import flat_size, leaf_spaces, remove_keys
from rlserve.models.spaces import space_to_json

__all__ = ["ConnectorLayout", "ConnectorPlanError", "plan_connectors"]

PREV_KEYS = ("_orig_obs", "prev_n_actions", "prev_n_rewards")  # PrevActionsPrevRewards' Dict, sorted
_HISTORY = ("PrevActionsPrevRewards", "FrameStacking")


class ConnectorPlanError(ValueError):
    """The connector chain cannot be reproduced by a bundle (the message says which and why)."""


@dataclass
class ConnectorLayout:
    """The JSON the bundle manifest keeps under ``connectors`` (see the module docstring)."""

    user_connectors: list[str]  # RLlib's list, in order
    server: list[dict[str, Any]] = field(default_factory=list)
    graph: list[dict[str, Any]] = field(default_factory=list)
    obs_shape: tuple[int, ...] = ()  # the model's obs input (after the server stages)
    module_obs_shape: tuple[int, ...] = ()
    module_obs_space: dict[str, Any] | None = None  # a structured module's Dict/Tuple (space JSON)

    @property
    def prev(self) -> dict[str, int]:
        stage = next((s for s in self.graph if s["class"] == "PrevActionsPrevRewards"), None)
        if stage is None:
            return {"n_prev_actions": 0, "n_prev_rewards": 0, "action_width": 0}
        return {k: int(stage[k]) for k in ("n_prev_actions", "n_prev_rewards", "action_width")}

    @property
    def frame_stack(self) -> dict[str, Any] | None:
        return next((s for s in self.graph if s["class"] == "FrameStacking"), None)

    def to_json(self) -> dict[str, Any]:
        return {"user_connectors": list(self.user_connectors), "server": self.server, "graph": self.graph,
                "obs_shape": list(self.obs_shape), "module_obs_shape": list(self.module_obs_shape),
                **({"module_obs_space": self.module_obs_space} if self.module_obs_space is not None else {}),
                # previous actions are kept per session as RLlib's one-hot rows (zeros: none yet)
                "prev_action_encoding": "one_hot" if self.prev["n_prev_actions"] else None}


def _refuse(message: str) -> ConnectorPlanError:
    return ConnectorPlanError(f"connector pipeline: {message}")


def _check_discrete_starts(space: gs.Space, what: str) -> None:
    for path, leaf in leaf_spaces(space):
        starts = np.ravel(getattr(leaf, "start", 0))
        if isinstance(leaf, gs.Discrete | gs.MultiDiscrete) and np.any(starts != 0):
            raise _refuse(f"{what}: {path or 'the space'} starts at {starts.tolist()}; RLlib one-hot encodes the "
                          "raw value (it fails for a start other than 0)")


def _server_stage(name: str, params: dict[str, Any], space: gs.Space) -> tuple[dict[str, Any], gs.Space]:
    if name == "FlattenObservations":
        _check_discrete_starts(space, "FlattenObservations")
        kept = remove_keys(space, params.get("keys_to_remove") or [])
        stage = {"class": name, "input_space": space_to_json(space),
                 "keys_to_remove": list(params.get("keys_to_remove") or [])}
        return stage, gs.Box(-np.inf, np.inf, (flat_size(kept),), np.float32)
    if name == "MeanStdFilter":
        return {"class": name, "filter": params["filter"]}, _filtered(space, params["filter"])
    raise _refuse(f"{name} cannot run here")


def _filtered(space: gs.Space, state: dict[str, Any]) -> gs.Space:
    if not isinstance(space, gs.Box):
        raise _refuse(f"MeanStdFilter on a {type(space).__name__} observation: only a filter over one Box "
                      "observation is served (put FlattenObservations before it)")
    if tuple(state["shape"]) != tuple(space.shape):
        raise _refuse(f"the MeanStdFilter's statistics have shape {state['shape']}, its input {list(space.shape)}")
    clip = state.get("clip")
    return gs.Box(-clip, clip, space.shape, space.dtype) if clip else space


def _flat_box(space: gs.Space) -> bool:
    return isinstance(space, gs.Box) and len(space.shape) == 1 and space.dtype == np.float32


def plan_connectors(steps: Sequence[tuple[str, dict[str, Any]]], env_obs_space: gs.Space,
                    env_action_space: gs.Space, module_obs_space: gs.Space, *,
                    structured_module: bool = False) -> ConnectorLayout:
    """Split RLlib's user connectors (``(name, params)`` in order) into server and graph stages.

    ``structured_module``: the module reads a Dict/Tuple observation itself (a traced custom
    module): the server flattens it into the model's row (``FlattenObservations``' order) and
    the graph rebuilds the structure the module sees (``layout.module_obs_space``)."""
    layout = ConnectorLayout(user_connectors=[name for name, _ in steps])
    space = env_obs_space
    index = 0
    while index < len(steps) and steps[index][0] not in _HISTORY:
        stage, space = _server_stage(*steps[index], space)
        layout.server.append(stage)
        index += 1
    rest = list(steps[index:])
    if rest and rest[0][0] == "PrevActionsPrevRewards":
        if not _flat_box(space):  # the graph appends to a flat row: flatten the observation part first
            stage, space = _server_stage("FlattenObservations", {}, space)
            layout.server.append(stage)
        assert isinstance(space, gs.Box)  # _flat_box or the flatten stage made it one
        space = _prev_actions_stages(layout, rest, space, env_action_space)
    elif rest:
        space = _frame_stacking_stage(layout, rest, space)
    if structured_module and not isinstance(space, gs.Box) and not layout.graph:
        if space != module_obs_space:
            raise _refuse(f"the connectors produce {space}, but the module was built for {module_obs_space}")
        layout.module_obs_space = space_to_json(space)
        stage, space = _server_stage("FlattenObservations", {}, space)
        layout.server.append(stage)
        module_obs_space = space
    if not isinstance(space, gs.Box):
        raise _refuse(f"the pipeline ends in a {type(space).__name__} observation; RLlib's default modules read "
                      "a Box (add FlattenObservations)")
    layout.obs_shape = tuple(int(d) for d in _graph_input(layout, space).shape or ())
    layout.module_obs_shape = tuple(int(d) for d in space.shape)
    if not isinstance(module_obs_space, gs.Box) or tuple(module_obs_space.shape) != layout.module_obs_shape:
        raise _refuse(f"the connectors produce observations of shape {list(layout.module_obs_shape)}, but the "
                      f"module was built for {module_obs_space}")
    return layout


def _graph_input(layout: ConnectorLayout, final: gs.Space) -> gs.Space:
    if not layout.graph:
        return final
    if layout.frame_stack is not None:
        return gs.Box(-np.inf, np.inf, tuple(layout.frame_stack["frame_shape"]), np.float32)
    return gs.Box(-np.inf, np.inf, (int(layout.graph[0]["obs_width"]),), np.float32)


def _prev_actions_stages(layout: ConnectorLayout, rest: list[tuple[str, dict[str, Any]]], space: gs.Box,
                         action_space: gs.Space) -> gs.Space:
    params = rest[0][1]
    if not isinstance(action_space, gs.Discrete) or int(action_space.start) != 0:
        raise _refuse(f"PrevActionsPrevRewards one-hot encodes Discrete actions (from 0) only; the action space "
                      f"is {action_space} (RLlib fails on it too)")
    n_a, n_r, width = int(params["n_prev_actions"]), int(params["n_prev_rewards"]), int(action_space.n)
    layout.graph.append({"class": "PrevActionsPrevRewards", "n_prev_actions": n_a, "n_prev_rewards": n_r,
                         "action_width": width, "obs_width": int(space.shape[0])})
    if len(rest) < 2 or rest[1][0] != "FlattenObservations":
        raise _refuse("PrevActionsPrevRewards makes a Dict observation that RLlib's default modules cannot read: "
                      "a FlattenObservations must follow it")
    removed = set(rest[1][1].get("keys_to_remove") or [])
    widths = {"_orig_obs": int(space.shape[0]), "prev_n_actions": n_a * width, "prev_n_rewards": n_r}
    keys = [k for k in PREV_KEYS if k not in removed]
    layout.graph.append({"class": "FlattenObservations", "keys": keys})
    out: gs.Space = gs.Box(-np.inf, np.inf, (sum(widths[k] for k in keys),), np.float32)
    for name, step_params in rest[2:]:
        if name != "MeanStdFilter":
            raise _refuse(f"{name} after PrevActionsPrevRewards and FlattenObservations is not served "
                          "(only a MeanStdFilter may follow there)")
        out = _filtered(out, step_params["filter"])
        layout.graph.append({"class": "MeanStdFilter", "filter": step_params["filter"]})
    return out


def _frame_stacking_stage(layout: ConnectorLayout, rest: list[tuple[str, dict[str, Any]]], space: gs.Space) -> gs.Space:
    num_frames = int(rest[0][1]["num_frames"])
    if len(rest) > 1:
        raise _refuse(f"{rest[1][0]} after FrameStacking: FrameStacking writes the module's batch itself, so RLlib "
                      "ignores what later connectors do to the episode; put it last")
    if not isinstance(space, gs.Box) or len(space.shape) != 3 or space.shape[-1] != 1:
        raise _refuse(f"FrameStacking stacks (H, W, 1) frames along the last axis; its input is {space}")
    layout.graph.append({"class": "FrameStacking", "num_frames": num_frames,
                         "frame_shape": [int(d) for d in space.shape]})
    return gs.Box(np.repeat(space.low, num_frames, axis=-1), np.repeat(space.high, num_frames, axis=-1),
                  (*space.shape[:-1], num_frames), space.dtype)
