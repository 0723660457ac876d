"""An RLlib checkpoint's observation-filter statistics as ``rlserve.models.filters`` state (torch-free).

RLlib keeps the trained MeanStdFilter twice:

- in the policy's agent connectors (``policy_state.pkl`` ``connector_configs["agent"]``,
  entry ``MeanStdObservationFilterAgentConnector``): what ``compute_single_action``
  applies, so it is preferred;
- in the rollout worker (``algorithm_state.pkl`` ``worker["filters"][policy_id]``, a
  pickled ``MeanStdFilter``), for checkpoints without connectors.

Statistics are RLlib's ``RunningStat`` (``num_pushes``, ``mean_array``,
``sum_sq_diff_array``; arrays serialized as in ``spaces.decode_ndarray`` or stored as
arrays). RLlib clips only when ``clip`` is truthy, so 0 and None both mean no clipping.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlserve.models.checkpoint.errors import CheckpointError
from rlserve.models.checkpoint.spaces import decode_ndarray
from rlserve.models.checkpoint.unpickler import Record
from rlserve.models.filters import MeanStdFilter

__all__ = ["FILTER_CONNECTORS", "filter_from_connectors", "filter_from_worker", "running_stat"]

FILTER_CONNECTORS = ("MeanStdObservationFilterAgentConnector", "ConcurrentMeanStdObservationFilterAgentConnector")


def _agent_connectors(connector_configs: Any) -> Sequence[Any]:
    agent = connector_configs.get("agent") if isinstance(connector_configs, Mapping) else None
    # ("AgentConnectorPipeline", [(name, params), ...]); msgpack turns the tuples into lists.
    if isinstance(agent, list | tuple) and len(agent) == 2 and isinstance(agent[1], list | tuple):
        return agent[1]
    return ()


def filter_from_connectors(connector_configs: Any, where: str) -> dict[str, Any] | None:
    """The filter state from a policy's ``connector_configs``; None if it has no filter connector."""
    for i, entry in enumerate(_agent_connectors(connector_configs)):
        if isinstance(entry, list | tuple) and len(entry) == 2 and entry[0] in FILTER_CONNECTORS:
            params = entry[1]
            here = f"{where} connector_configs['agent'][{i}] ({entry[0]})"
            if not isinstance(params, Mapping):
                raise CheckpointError(f"{here}: expected the filter's parameters, got {type(params).__name__}")
            return _filter_state(params, params.get("running_stats"), here)
    return None


def filter_from_worker(worker_filter: Any, where: str) -> dict[str, Any] | None:
    """The filter state from a rollout worker's pickled ``MeanStdFilter`` (None for NoFilter)."""
    if not isinstance(worker_filter, Record):
        raise CheckpointError(f"{where}: expected a pickled RLlib filter, got {type(worker_filter).__name__}")
    name = worker_filter.qualname.rpartition(".")[2]
    if name == "NoFilter":
        return None
    if name not in ("MeanStdFilter", "ConcurrentMeanStdFilter"):
        raise CheckpointError(f"{where}: filter class {worker_filter.qualname} is not supported")
    fields = worker_filter.fields
    return _filter_state(fields, fields.get("running_stats"), where)


def _filter_state(params: Mapping[str, Any], running_stats: Any, where: str) -> dict[str, Any]:
    if params.get("no_preprocessor"):
        raise CheckpointError(
            f"{where}: the filter runs per component of an unflattened observation "
            "(_disable_preprocessor_api); only filters on the flat preprocessed observation are supported"
        )
    stats = list(running_stats) if isinstance(running_stats, list | tuple) else [running_stats]
    if len(stats) != 1:
        raise CheckpointError(f"{where}: expected one running statistic for the flat observation, found {len(stats)}")
    num_pushes, mean, sum_sq_diff = running_stat(stats[0], f"{where} running_stats")
    shape = params.get("shape")
    shape_list = list(mean.shape) if shape is None else [int(d) for d in np.asarray(shape).ravel()]
    clip = params.get("clip")
    state = {
        "type": "MeanStdFilter",
        "shape": shape_list,
        "demean": bool(params.get("demean", True)),
        "destd": bool(params.get("destd", True)),
        "clip": float(clip) if clip else None,
        "num_pushes": num_pushes,
        "mean": mean.tolist(),
        "sum_sq_diff": sum_sq_diff.tolist(),
    }
    try:
        return MeanStdFilter.from_state(state).state_dict()
    except ValueError as exc:
        raise CheckpointError(f"{where}: {exc}") from None


def running_stat(stat: Any, where: str) -> tuple[int, np.ndarray, np.ndarray]:
    """(num_pushes, mean, sum_sq_diff) of one RLlib ``RunningStat`` state (a record or its dict)."""
    fields = stat.fields if isinstance(stat, Record) else stat
    if not isinstance(fields, Mapping):
        raise CheckpointError(f"{where}: expected RLlib's RunningStat state, got {type(stat).__name__}")
    # RLlib >= 2.0 names; older releases used _n/_M/_S.
    keys = ("num_pushes", "mean_array", "sum_sq_diff_array") if "num_pushes" in fields else ("_n", "_M", "_S")
    missing = [k for k in keys if k not in fields]
    if missing:
        raise CheckpointError(f"{where}: missing {missing} (has {sorted(map(str, fields))})")
    n = fields[keys[0]]
    mean = decode_ndarray(fields[keys[1]], f"{where}.{keys[1]}").astype(np.float64)
    sum_sq_diff = decode_ndarray(fields[keys[2]], f"{where}.{keys[2]}").astype(np.float64)
    return int(n), mean, sum_sq_diff
