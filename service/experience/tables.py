"""The log's Parquet tables: RLlib's columns form, its episodes form, and delayed rewards.

Columns form (one row per transition; RLlib's ``Columns`` names, read by its
``OfflinePreLearner._map_to_episodes`` into one-step episodes): ``eps_id``, ``agent_id``,
``module_id``, ``t``, ``obs``, ``actions``, ``rewards``, ``new_obs``, ``terminateds``,
``truncateds`` and ``infos`` are its schema's columns; RLlib makes every other column an
extra model output of the step (``action_logp``, ``actions_for_env``, ``explore``), which a
learner may batch as tensors, so those are numeric, and the strings and nullable values
(model, version, event id, time, value) sit in ``infos``.

Shadow scores (one row per logged step a shadow candidate scored, ``rlserve.service.shadow``):
``event_id`` joins them to the columns form's ``infos.event_id``.

Episodes form (one row per episode segment): ``item`` holds the segment's
``SingleAgentEpisode.get_state()`` msgpack-encoded (``rlserve.service.experience.episode_state``),
what RLlib reads with ``input_read_episodes=True``; the other columns repeat what a reader
joins segments by without decoding ``item``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from rlserve.service.experience import episode_state, space_columns
from rlserve.service.experience.records import (
    TERMINATED,
    TRUNCATED,
    Fields,
    ModelLog,
    RewardEvent,
    ShadowScore,
    Transition,
)

INFOS = pa.struct([
    ("model", pa.string()), ("version", pa.string()), ("event_id", pa.string()),
    ("time", pa.float64()), ("value", pa.float64()), ("explore", pa.bool_()),
])


def columns_schema(model: ModelLog) -> pa.Schema:
    obs, actions = space_columns.arrow_type(model.obs_space), space_columns.arrow_type(model.action_space)
    return pa.schema([
        ("eps_id", pa.string()), ("agent_id", pa.string()), ("module_id", pa.string()), ("t", pa.int64()),
        ("obs", obs), ("actions", actions), ("rewards", pa.float64()), ("new_obs", obs),
        ("terminateds", pa.bool_()), ("truncateds", pa.bool_()), ("action_logp", pa.float32()),
        ("actions_for_env", actions), ("explore", pa.bool_()), ("infos", INFOS),
    ])


def columns_table(model: ModelLog, rows: list[Transition]) -> pa.Table:
    """The transitions as one table, a column at a time."""
    f = Fields(rows)
    n = len(rows)
    obs_space, action_space = model.obs_space, model.action_space
    ends = np.array(f.end, np.int8)
    explore = pa.array(np.array(f.explore, np.bool_))
    infos = pa.StructArray.from_arrays([
        _repeat(model.name, n), _strings(f.version), pa.array(f.event_id, pa.string()),
        pa.array(np.array(f.time, np.float64)), _nullable(np.array(f.value, np.float64)), explore,
    ], fields=list(INFOS))
    actions = space_columns.arrow_array(action_space, f.action)
    columns = {
        "eps_id": pa.array(f.eps_id, pa.string()),
        # Null for a single agent (as RLlib writes single-agent episodes); a policy set's
        # agent and its policy id otherwise.
        "agent_id": _strings(f.agent_id),
        "module_id": _strings(f.module_id),
        "t": pa.array(np.array(f.t, np.int64)),
        "obs": space_columns.arrow_array(obs_space, f.obs),
        "actions": actions,
        "rewards": pa.array(np.array(f.reward, np.float64)),
        "new_obs": space_columns.arrow_array(obs_space, f.next_obs),
        "terminateds": pa.array(ends == TERMINATED),
        "truncateds": pa.array(ends == TRUNCATED),
        "action_logp": pa.array(np.array(f.logp, np.float32)),
        "actions_for_env": actions if f.env_action is f.action else space_columns.arrow_array(action_space,
                                                                                             f.env_action),
        "explore": explore,
        "infos": infos,
    }
    return pa.table(columns, schema=columns_schema(model))


EPISODES_SCHEMA = pa.schema([
    ("item", pa.binary()), ("eps_id", pa.string()), ("agent_id", pa.string()), ("module_id", pa.string()),
    ("t_started", pa.int64()), ("length", pa.int64()), ("is_terminated", pa.bool_()),
    ("is_truncated", pa.bool_()), ("model", pa.string()), ("version", pa.string()),
])


def episodes_table(model: ModelLog, segments: list[list[Transition]]) -> pa.Table:
    items = episode_state.encode_segments(model, segments)
    first = [segment[0].step for segment in segments]
    last = [segment[-1] for segment in segments]
    columns = {
        "item": pa.array(items, pa.binary()),
        "eps_id": pa.array([s.eps_id for s in first], pa.string()),
        "agent_id": _strings([s.agent_id for s in first]),
        "module_id": _strings([s.module_id for s in first]),
        "t_started": pa.array([s.t for s in first], pa.int64()),
        "length": pa.array([len(segment) for segment in segments], pa.int64()),
        "is_terminated": pa.array([r.end == 1 for r in last], pa.bool_()),
        "is_truncated": pa.array([r.end == 2 for r in last], pa.bool_()),
        "model": _repeat(model.name, len(segments)),
        "version": _strings([r.step.version for r in last]),
    }
    return pa.table(columns, schema=EPISODES_SCHEMA)


REWARDS_SCHEMA = pa.schema([("event_id", pa.string()), ("reward", pa.float64()), ("mode", pa.string()),
                            ("time", pa.float64())])


def rewards_table(events: list[RewardEvent]) -> pa.Table:
    return pa.table({
        "event_id": pa.array([e.event_id for e in events], pa.string()),
        "reward": pa.array([e.reward for e in events], pa.float64()),
        "mode": pa.array([e.mode for e in events], pa.string()),
        "time": pa.array([e.time for e in events], pa.float64()),
    }, schema=REWARDS_SCHEMA)


def shadow_schema(model: ModelLog) -> pa.Schema:
    return pa.schema([("event_id", pa.string()), ("candidate", pa.string()), ("logp", pa.float64()),
                      ("actions", space_columns.arrow_type(model.action_space)),
                      ("dist_inputs", pa.list_(pa.float32())), ("time", pa.float64())])


def shadow_table(model: ModelLog, scores: list[ShadowScore]) -> pa.Table:
    """A shadow candidate's scores of logged steps, joined to ``columns/`` by ``event_id``."""
    widths = np.fromiter((len(s.dist_inputs) // 4 for s in scores), np.int32, len(scores))
    offsets = np.concatenate([[0], np.cumsum(widths)]).astype(np.int32)
    values = np.frombuffer(b"".join(s.dist_inputs for s in scores), np.float32)
    return pa.table({
        "event_id": pa.array([s.event_id for s in scores], pa.string()),
        "candidate": _strings([s.candidate for s in scores]),
        "logp": pa.array(np.array([s.logp for s in scores], np.float64)),
        "actions": space_columns.arrow_array(model.action_space, [s.action for s in scores]),
        "dist_inputs": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)),
        "time": pa.array(np.array([s.time for s in scores], np.float64)),
    }, schema=shadow_schema(model))


def _strings(values: Sequence[str | None]) -> pa.Array:
    """A string column; one value repeated (a version, a candidate; None for a single agent's
    ``agent_id``) is made without converting each row's."""
    if values and values.count(values[0]) == len(values):
        return _repeat(values[0], len(values))
    return pa.array(values, pa.string())


def _repeat(value: str | None, count: int) -> pa.Array:
    return pa.nulls(count, pa.string()) if value is None else pa.repeat(pa.scalar(value, pa.string()), count)


def _nullable(values: np.ndarray) -> pa.Array:
    """Floats with NaN as null (``from_pandas=True`` would import pandas for it)."""
    return pa.array(values, mask=np.isnan(values))
