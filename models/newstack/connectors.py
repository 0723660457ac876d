"""The connector pipelines of a new-stack checkpoint, read as data (torch-free).

``env_runner/env_to_module_connector/class_and_ctor_args.pkl`` holds the pipeline's
constructor: ``(env observation space, env action space)`` and ``connectors=[(class, args,
kwargs), ...]`` in pipeline order, the user's connectors first; a connector with state has
a directory of its own below (``MeanStdFilter/state.pkl``). ``module_to_env_connector`` holds
the other direction; of it only ``NormalizeAndClipActions``'s settings matter to a server.

``read_connectors`` returns a ``ConnectorPlan``: the env spaces and the user's connectors
as ``ConnectorStep``s (a name and JSON-able parameters, with a MeanStdFilter's trained
statistics as ``rlserve.models.filters`` state, served frozen). RLlib's default connectors
(batching, time axis, state in/out, tensor conversion, action sampling) are what the server
does anyway and are dropped. A connector nobody here reproduces is refused, by name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gymnasium import spaces as gs

from rlserve.models.checkpoint.errors import CheckpointError
from rlserve.models.checkpoint.filters import running_stat
from rlserve.models.checkpoint.spaces import rllib_space
from rlserve.models.checkpoint.unpickler import dotted_name
from rlserve.models.filters import MeanStdFilter
from rlserve.models.newstack.state import read_ctor, read_state_file

__all__ = ["SUPPORTED_CONNECTORS", "ConnectorPlan", "ConnectorStep", "read_connectors"]

_RLLIB_CONNECTORS = "ray.rllib.connectors."
# RLlib's default pieces: what a server does for every request anyway.
_DEFAULT_ENV_TO_MODULE = frozenset((
    "AddObservationsFromEpisodesToBatch", "AddTimeDimToBatchAndZeroPad", "AddStatesFromEpisodesToBatch",
    "AgentToModuleMapping", "BatchIndividualItems", "NumpyToTensor",
))
_DEFAULT_MODULE_TO_ENV = frozenset((
    "GetActions", "TensorToNumpy", "UnBatchToIndividualItems", "ModuleToAgentUnmapping",
    "RemoveSingleTsTimeRankFromBatch", "NormalizeAndClipActions", "ListifyDataForVectorEnv",
))
SUPPORTED_CONNECTORS = ("MeanStdFilter", "FlattenObservations", "PrevActionsPrevRewards", "FrameStacking")


@dataclass(frozen=True)
class ConnectorStep:
    """One user connector of the env-to-module pipeline: RLlib's class name and parameters."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ConnectorPlan:
    env_observation_space: gs.Space | None  # None: no pipeline found (a module saved on its own)
    env_action_space: gs.Space | None
    env_to_module: tuple[ConnectorStep, ...]
    normalize_actions: bool | None  # None: not recorded in a module-to-env pipeline
    clip_actions: bool | None
    # The pipeline maps agents to modules: its spaces are per agent, a module sees its own.
    multi_agent: bool = False

    @property
    def found(self) -> bool:
        return self.env_observation_space is not None or self.multi_agent


def _class_name(entry: Any, where: str) -> tuple[str, str]:
    """(short name, dotted name) of a pipeline entry's class."""
    dotted = dotted_name(entry)
    if dotted is None:
        raise CheckpointError(f"{where}: expected a connector class, got {type(entry).__name__}")
    return dotted.rpartition(".")[2], dotted


def _entries(ctor: Mapping[str, Any], where: str) -> tuple[tuple[Any, ...], list[tuple[str, str, dict[str, Any]]]]:
    args, kwargs = ctor["args"], ctor["kwargs"]
    connectors = kwargs.get("connectors") or []
    if not isinstance(connectors, list | tuple):
        raise CheckpointError(f"{where}: 'connectors' is not a list")
    out = []
    for i, item in enumerate(connectors):
        if not (isinstance(item, list | tuple) and len(item) == 3 and isinstance(item[2], Mapping)):
            raise CheckpointError(f"{where}: connectors[{i}] is not (class, args, kwargs)")
        short, dotted = _class_name(item[0], f"{where} connectors[{i}]")
        if item[1]:
            raise CheckpointError(f"{where}: connector {dotted} has positional arguments; not read")
        out.append((short, dotted, dict(item[2])))
    return tuple(args), out


def read_connectors(env_to_module: Path | None, module_to_env: Path | None) -> ConnectorPlan:
    """The plan of the pipelines in these directories (either may be None: not written)."""
    obs_space = action_space = None
    multi_agent = False
    steps: list[ConnectorStep] = []
    if env_to_module is not None:
        where = str(env_to_module / "class_and_ctor_args.pkl")
        args, entries = _entries(read_ctor(env_to_module), where)
        multi_agent = any(short == "AgentToModuleMapping" for short, _, _ in entries)
        if len(args) >= 2 and not multi_agent:
            obs_space = rllib_space(args[0], f"{where} observation space")
            action_space = rllib_space(args[1], f"{where} action space")
        for short, dotted, kwargs in entries:
            if short in _DEFAULT_ENV_TO_MODULE and dotted.startswith(_RLLIB_CONNECTORS):
                continue
            if multi_agent:
                raise CheckpointError(f"{where}: the multi-agent pipeline runs {dotted} per agent; multi-agent "
                                      "connector pipelines are not served yet (only RLlib's default connectors)")
            steps.append(_user_step(short, dotted, kwargs, env_to_module, where))
    normalize = clip = None
    if module_to_env is not None:
        where = str(module_to_env / "class_and_ctor_args.pkl")
        for short, dotted, kwargs in _entries(read_ctor(module_to_env), where)[1]:
            if short not in _DEFAULT_MODULE_TO_ENV or not dotted.startswith(_RLLIB_CONNECTORS):
                raise CheckpointError(_refusal(dotted, where, "module-to-env"))
            if short == "NormalizeAndClipActions":
                normalize = bool(kwargs.get("normalize_actions", True))
                clip = bool(kwargs.get("clip_actions", False))
    return ConnectorPlan(obs_space, action_space, tuple(steps), normalize, clip, multi_agent)


def _refusal(dotted: str, where: str, direction: str) -> str:
    return (f"{where}: the {direction} connector {dotted} cannot be reproduced by a bundle (supported: "
            f"{', '.join(SUPPORTED_CONNECTORS)} and RLlib's default connectors); serve it as a custom model "
            "that takes the connector's output (docs/custom_models.md)")


def _user_step(short: str, dotted: str, kwargs: dict[str, Any], pipeline_dir: Path, where: str) -> ConnectorStep:
    if short not in SUPPORTED_CONNECTORS or not dotted.startswith(_RLLIB_CONNECTORS):
        raise CheckpointError(_refusal(dotted, where, "env-to-module"))
    if kwargs.get("multi_agent"):
        raise CheckpointError(f"{where}: {short} runs per agent (multi_agent=True); multi-agent connector "
                              "pipelines are not served yet")
    if short == "MeanStdFilter":
        return ConnectorStep(short, {"filter": _filter_state(pipeline_dir / short, kwargs)})
    if short == "FlattenObservations":
        keys = kwargs.get("keys_to_remove")
        return ConnectorStep(short, {"keys_to_remove": [str(k) for k in keys] if keys else []})
    if short == "PrevActionsPrevRewards":
        return ConnectorStep(short, {"n_prev_actions": _count(kwargs, "n_prev_actions", where),
                                     "n_prev_rewards": _count(kwargs, "n_prev_rewards", where)})
    if kwargs.get("as_learner_connector"):
        raise CheckpointError(f"{where}: FrameStacking(as_learner_connector=True) in an env-to-module pipeline")
    return ConnectorStep(short, {"num_frames": max(_count(kwargs, "num_frames", where), 1)})


def _count(kwargs: Mapping[str, Any], key: str, where: str) -> int:
    value = kwargs.get(key, 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CheckpointError(f"{where}: {key}={value!r} is not a non-negative integer")
    return int(value)


def _filter_state(directory: Path, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The trained statistics (``<pipeline>/MeanStdFilter/state.*``) as frozen filter state."""
    state_file = next((directory / f"state{s}" for s in (".pkl", ".msgpack") if (directory / f"state{s}").is_file()),
                      None)
    if state_file is None:
        raise CheckpointError(f"{directory}: the MeanStdFilter's statistics (state.pkl) are missing; serving "
                              "without them would answer differently")
    state = read_state_file(state_file)
    per_agent = state.get(None, state.get("None")) if isinstance(state, Mapping) else None
    if not isinstance(per_agent, Mapping):
        raise CheckpointError(f"{state_file}: expected the single-agent filter state under the key None")
    stats = per_agent.get("running_stats")
    if not isinstance(stats, Sequence) or len(stats) != 1:
        raise CheckpointError(f"{state_file}: expected one running statistic (a filter over one Box "
                              f"observation), found {len(stats) if isinstance(stats, Sequence) else stats!r}")
    n, mean, sum_sq = running_stat(stats[0], f"{state_file} running_stats[0]")
    clip = per_agent.get("clip_by_value", kwargs.get("clip_by_value", 10.0))
    try:
        return MeanStdFilter.from_state({
            "type": "MeanStdFilter", "shape": list(mean.shape),
            "demean": bool(per_agent.get("de_mean_to_zero", kwargs.get("de_mean_to_zero", True))),
            "destd": bool(per_agent.get("de_std_to_one", kwargs.get("de_std_to_one", True))),
            # RLlib clips only when clip_by_value is truthy.
            "clip": float(clip) if clip else None,
            "num_pushes": n, "mean": mean.tolist(), "sum_sq_diff": sum_sq.tolist(),
        }).state_dict()
    except ValueError as exc:
        raise CheckpointError(f"{state_file}: {exc}") from None
