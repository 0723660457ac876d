"""Write small checkpoints in RLlib's (2.x, old API stack) layout for unit tests.

What RLlib writes, without ray: ``policies/<id>/policy_state.pkl`` holding ``weights``
(the catalog model's state_dict under RLlib's names), ``policy_spec`` with the spaces in
``space_to_dict`` form and a config with ``model``, ``observation_filter``,
``normalize_actions``, ``clip_actions``, and optionally ``connector_configs`` with
MeanStdFilter statistics in RLlib's ``RunningStat.to_state`` form. The conformance tests
use real RLlib checkpoints; these exist to reach the error paths.
"""

from __future__ import annotations

import base64
import copy
import io
import json
import pickle
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces as gs

from rlserve.models.catalog import build_model


def serialize_ndarray(array: np.ndarray) -> str:
    buf = io.BytesIO()
    np.save(buf, array)
    return base64.b64encode(zlib.compress(buf.getvalue())).decode("ascii")


def gym_space_to_dict(space: gs.Space) -> dict[str, Any]:
    if isinstance(space, gs.Box):
        return {"space": "box", "low": serialize_ndarray(space.low), "high": serialize_ndarray(space.high),
                "shape": space.shape, "dtype": space.dtype.str}
    if isinstance(space, gs.Discrete):
        return {"space": "discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gs.MultiDiscrete):
        return {"space": "multi-discrete", "nvec": serialize_ndarray(space.nvec), "dtype": space.dtype.str}
    if isinstance(space, gs.MultiBinary):
        return {"space": "multi-binary", "n": space.n}
    if isinstance(space, gs.Tuple):
        return {"space": "tuple", "spaces": [gym_space_to_dict(s) for s in space.spaces]}
    if isinstance(space, gs.Dict):
        return {"space": "dict", "spaces": {k: gym_space_to_dict(s) for k, s in space.spaces.items()}}
    raise TypeError(space)


def running_stat_state(observations: np.ndarray) -> dict[str, Any]:
    """RLlib's RunningStat.to_state() after pushing ``observations`` one by one."""
    mean = observations.mean(axis=0)
    sum_sq = ((observations - mean) ** 2).sum(axis=0)
    arrays = {"mean_array": mean, "sum_sq_diff_array": sum_sq}
    state: dict[str, Any] = {"num_pushes": len(observations), "num_pushes_delta": len(observations)}
    for key, value in arrays.items():
        state[key] = serialize_ndarray(value)
        state[key.replace("_array", "_delta_array")] = serialize_ndarray(value)
    return state


def filter_connector(shape: tuple[int, ...], observations: np.ndarray, clip: float | None = None) -> tuple:
    params = {"shape": np.array(shape), "no_preprocessor": False, "demean": True, "destd": True, "clip": clip,
              "running_stats": [running_stat_state(observations)], "buffer": []}
    return ("MeanStdObservationFilterAgentConnector", params)


def policy_state(
    obs_space: gs.Space, action_space: gs.Space, model: dict[str, Any], *, observation_filter: str = "NoFilter",
    agent_connectors: list[tuple] | None = None, normalize_actions: bool = True, clip_actions: bool = False,
    seed: int = 0,
) -> dict[str, Any]:
    import torch

    model = copy.deepcopy(model)
    torch.manual_seed(seed)
    net = build_model(obs_space, action_space, model)
    weights = {k.removeprefix("base."): v.numpy().copy() for k, v in net.state_dict().items()}
    config = {"model": model, "observation_filter": observation_filter, "normalize_actions": normalize_actions,
              "clip_actions": clip_actions, "explore": True, "framework": "torch", "env": "SomeEnv-v0"}
    state: dict[str, Any] = {
        "weights": weights,
        "policy_spec": {"policy_class": "PPOTorchPolicy", "observation_space": {"space": gym_space_to_dict(obs_space)},
                        "action_space": {"space": gym_space_to_dict(action_space)}, "config": config},
        "global_timestep": 10,
    }
    if agent_connectors is not None:
        state["connector_configs"] = {"agent": ("AgentConnectorPipeline", agent_connectors),
                                      "action": ("ActionConnectorPipeline", [])}
    return state


def write_algorithm_checkpoint(root: Path, states: dict[str, dict[str, Any]], algorithm_state: Any = None) -> Path:
    """``root`` as an RLlib Algorithm checkpoint holding ``states`` (policy id -> state)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "rllib_checkpoint.json").write_text(json.dumps(
        {"type": "Algorithm", "checkpoint_version": "1.1", "format": "cloudpickle", "state_file": "algorithm_state.pkl",
         "policy_ids": sorted(states), "ray_version": "2.60.0"}))
    (root / "algorithm_state.pkl").write_bytes(pickle.dumps(algorithm_state or {"worker": {"filters": {}}}))
    for policy_id, state in states.items():
        directory = root / "policies" / policy_id
        directory.mkdir(parents=True)
        (directory / "policy_state.pkl").write_bytes(pickle.dumps(state))
        (directory / "rllib_checkpoint.json").write_text(json.dumps(
            {"type": "Policy", "checkpoint_version": "1.1", "format": "cloudpickle", "state_file": "policy_state.pkl",
             "ray_version": "2.60.0"}))
    return root
