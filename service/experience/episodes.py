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

import math
from typing import Any

import msgpack
import numpy as np

from rlserve.service.experience import spaces
from rlserve.service.experience.records import TERMINATED, TRUNCATED, ModelLog, Transition


def encode_segment(model: ModelLog, segment: list[Transition]) -> bytes:
    return msgpack.packb(segment_state(model, segment), default=_encode_array)


def segment_state(model: ModelLog, segment: list[Transition]) -> dict[str, Any]:
    steps = [transition.step for transition in segment]
    obs_space, action_space = model.obs_space, model.action_space
    observations = [s.obs for s in steps] + [segment[-1].next_obs]
    actions = [s.action for s in steps]
    env_actions = [s.action if s.env_action is None else s.env_action for s in steps]
    n = len(steps)
    last = segment[-1].end
    return {
        "id_": steps[0].eps_id,
        "agent_id": None,  # one agent; a multi-agent session will write one segment per agent
        "module_id": None,
        "multi_agent_episode_id": None,
        "observations": _buffer(_stack(obs_space, observations)),
        "actions": _buffer(_stack(action_space, actions)),
        "rewards": _buffer(np.fromiter((t.reward for t in segment), np.float32, n)),
        "infos": _buffer([{} for _ in range(n + 1)]),
        "extra_model_outputs": {
            "action_logp": _buffer(np.fromiter((math.nan if s.logp is None else s.logp for s in steps),
                                               np.float32, n)),
            "actions_for_env": _buffer(_stack(action_space, env_actions)),
        },
        "is_terminated": last == TERMINATED,
        "is_truncated": last == TRUNCATED,
        "t_started": steps[0].t,
        "t": steps[0].t + len(segment),
        "_observation_space": None,
        "_action_space": None,
        "_start_time": steps[0].time,
        "_last_step_time": steps[-1].time,
        # Per step, what a reader wants besides the trajectory (never batched by a learner).
        "custom_data": {
            "model": model.name,
            "event_ids": [s.event_id for s in steps],
            "versions": [s.version for s in steps],
            "times": np.fromiter((s.time for s in steps), np.float64, n),
            "values": np.fromiter((math.nan if s.value is None else s.value for s in steps), np.float64, n),
            "explore": np.fromiter((s.explore for s in steps), np.bool_, n),
        },
    }


def _buffer(data: Any) -> dict[str, Any]:
    """An ``InfiniteLookbackBuffer`` state: all data in the segment, none in the lookback."""
    return {"data": data, "lookback": 0, "finalized": not isinstance(data, list), "space": None}


def _stack(space: Any, values: list[Any]) -> Any:
    """One array (N, *shape) of the space's values; a list of JSON values for composite spaces."""
    return spaces.stack(space, values)


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
