"""The episodes form's ``item``: an episode segment as RLlib's ``SingleAgentEpisode.get_state()``.

RLlib (``OfflinePreLearner`` with ``input_read_episodes=True``) reads each ``item`` with
``msgpack.unpackb(item, object_hook=msgpack_numpy.decode)`` and
``SingleAgentEpisode.from_state``. The state written here has every field ``from_state``
reads; its arrays are msgpack_numpy's maps of raw bytes (``nd``, ``type``, ``kind``,
``shape``, ``data``), never of kind ``O`` (which msgpack_numpy would unpickle), and the
spaces are left out (``None``): RLlib stores spaces with ``np.load(allow_pickle=True)``,
and a training run knows its spaces from its config. So reading an item never unpickles.

The segment's data (``finalized``: numpy arrays, no lookback):

- ``observations``: T+1 observations (the one each action was taken at, then the last);
- ``actions``, ``rewards`` (float32): T each;
- ``infos``: T+1 empty maps;
- ``extra_model_outputs``: ``action_logp`` (float32, NaN where the distribution defines
  none) and ``actions_for_env`` (the actions as answered, after unsquash/clip);
- ``custom_data``: the model, and per step its event id, version, time, value (NaN where
  not computed) and ``explore``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import numpy as np

from rlserve.service.experience import space_columns
from rlserve.service.experience.records import TERMINATED, TRUNCATED, Fields, ModelLog, Transition

_NO_INFO: dict[str, Any] = {}  # one object for every step's info: nothing new for the collector


def encode_segments(model: ModelLog, segments: list[list[Transition]]) -> list[bytes]:
    """Each segment's state as msgpack: msgspec's encoder (half the CPU of msgpack's), with
    the bytes ``msgpack.packb(state, default=_encode_array)`` writes (tests check they agree)."""
    return [_ENCODER.encode(state) for state in segment_states(model, segments)]


def segment_states(model: ModelLog, segments: list[list[Transition]]) -> Iterator[dict[str, Any]]:
    """The segments' states, one after the other. The transitions' fields are read, and their
    numbers converted to arrays, once for all the segments (a write holds a hundred or more);
    each state holds its segment's slices of them."""
    f = Fields([transition for segment in segments for transition in segment])
    obs_space, action_space = model.obs_space, model.action_space
    actions = space_columns.stack(action_space, f.action)
    env_actions = actions if f.env_action is f.action else space_columns.stack(action_space, f.env_action)
    rewards, logp = np.array(f.reward, np.float32), np.array(f.logp, np.float32)
    times, values = np.array(f.time, np.float64), np.array(f.value, np.float64)
    explore = np.array(f.explore, np.bool_)
    start = 0
    for segment in segments:
        end = start + len(segment)
        last = f.end[end - 1]
        first_t = f.t[start]
        yield {
            "id_": f.eps_id[start],
            # A policy set's agent is written as a single-agent episode of its own (RLlib's
            # offline reader takes no multi-agent episodes), with its agent and module id.
            "agent_id": f.agent_id[start],
            "module_id": f.module_id[start],
            "multi_agent_episode_id": None,
            "observations": _buffer(space_columns.stack(obs_space, [*f.obs[start:end], f.next_obs[end - 1]])),
            "actions": _buffer(actions[start:end]),
            "rewards": _buffer(rewards[start:end]),
            "infos": _buffer([_NO_INFO] * (end - start + 1)),
            "extra_model_outputs": {
                "action_logp": _buffer(logp[start:end]),
                "actions_for_env": _buffer(env_actions[start:end]),
            },
            "is_terminated": last == TERMINATED,
            "is_truncated": last == TRUNCATED,
            "t_started": first_t,
            "t": first_t + end - start,
            "_observation_space": None,
            "_action_space": None,
            "_start_time": f.time[start],
            "_last_step_time": f.time[end - 1],
            # Per step, what a reader wants besides the trajectory (never batched by a learner).
            "custom_data": {
                "model": model.name,
                "event_ids": f.event_id[start:end],
                "versions": f.version[start:end],
                "times": times[start:end],
                "values": values[start:end],
                "explore": explore[start:end],
            },
        }
        start = end


def _buffer(data: Any) -> dict[str, Any]:
    """An ``InfiniteLookbackBuffer`` state: all data in the segment, none in the lookback."""
    return {"data": data, "lookback": 0, "finalized": not isinstance(data, list), "space": None}


def _encode_value(value: Any) -> Any:
    """What msgspec hands over that msgpack would write itself: subclasses of a float or a
    str (``numpy.float64``, ``numpy.str_``) are written as the plain value; the rest are numpy's."""
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return _encode_array(value)


def _encode_array(value: Any) -> Any:
    """msgpack_numpy's encoding of numpy values (bytes keys, raw little-endian data)."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "OV":
            raise TypeError(f"an episode holds no {value.dtype} arrays (they would need pickle to read)")
        array = np.ascontiguousarray(value)
        return {b"nd": True, b"type": array.dtype.str, b"kind": b"", b"shape": list(array.shape),
                b"data": array.tobytes()}
    if isinstance(value, np.bool_ | np.number):
        return {b"nd": False, b"type": value.dtype.str, b"data": value.tobytes()}
    raise TypeError(f"cannot encode a {type(value).__name__} in an episode")


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_encode_value)
