"""openpi's frames, in process: the observation dict to a step, the answer as openpi's client reads it.

The answer is read back the way ``openpi_client.msgpack_numpy.unpackb`` reads it (an object
hook that knows only bin keys), so a map written with str keys would stay a map here.
The real client plays against a real server in tests/e2e/test_openpi_e2e.py.
"""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from gymnasium import spaces as gs

from rlserve.client.stream import pack_array
from rlserve.service.act.wire import ActResponse
from rlserve.service.errors import BadRequest
from rlserve.service.stream import frames
from rlserve.service.stream.openpi import OpenpiFrames

BOX = OpenpiFrames("/v1/models/{name}/openpi", "observation", dict_space=False)


def _openpi_unpack(data: bytes):
    """openpi-client 0.1.2's reading of a frame: arrays are maps with bin keys."""
    def hook(obj):
        if b"__ndarray__" in obj:
            return np.ndarray(buffer=obj[b"data"], dtype=np.dtype(obj[b"dtype"]), shape=obj[b"shape"])
        return obj
    return msgpack.unpackb(data, object_hook=hook)


def test_the_observation_key_and_the_step_keys_are_read_and_others_ignored() -> None:
    obs = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    step = BOX.decode(frames.BINARY, msgpack.packb(
        {"observation": obs, "reward": 1.0, "episode_start": True, "seed": 3, "prompt": "go", "image": obs},
        default=pack_array))
    np.testing.assert_array_equal(step.observation, obs)
    assert (step.reward, step.episode_start, step.seed) == (1.0, True, 3)
    state = OpenpiFrames("/", "state", dict_space=False).decode(frames.BINARY, msgpack.packb({"state": [1, 2]}))
    assert state.observation == [1, 2]


def test_a_dict_space_takes_the_other_keys_and_a_box_refuses_a_dict_without_the_key() -> None:
    spaced = OpenpiFrames("/", "observation", dict_space=True)
    step = spaced.decode(frames.BINARY, msgpack.packb({"pos": [1.0], "vel": [2.0], "reward": 0.5}))
    assert step.observation == {"pos": [1.0], "vel": [2.0]} and step.reward == 0.5
    with pytest.raises(BadRequest) as refused:
        BOX.decode(frames.BINARY, msgpack.packb({"state": [1.0]}))
    assert not isinstance(refused.value, frames.Unreadable)  # read, but not a step: not counted
    assert refused.value.field == "observation" and "state" in str(refused.value.received)
    with pytest.raises(frames.Unreadable):
        BOX.decode(frames.TEXT, '{"observation": [1, 2, 3, 4]}')


@pytest.mark.parametrize(("space", "action", "expected"), [
    (gs.Discrete(2), 1, np.array(1)),
    (gs.Box(-1, 1, (2,), np.float32), [0.5, -0.25], np.array([0.5, -0.25], np.float32)),
])
def test_the_answer_carries_actions_as_numpy_openpi_reads(space, action, expected) -> None:
    response = ActResponse(model="m", version="1", explore=True, logp=-0.5, action=action)
    sent = BOX.answer(frames.BINARY, response, None, space, started=0.0)
    answer = _openpi_unpack(sent["bytes"])
    assert isinstance(answer["actions"], np.ndarray) and answer["actions"].dtype == expected.dtype
    np.testing.assert_array_equal(answer["actions"], expected)
    assert answer["logp"] == -0.5 and "action" not in answer and answer["server_timing"]["infer_ms"] > 0


def test_a_refusal_is_a_text_frame_of_the_json_error_body() -> None:
    sent = BOX.error(frames.BINARY, BadRequest("no", field="observation", expected="x", received="y"), None)
    assert '"field":"observation"' in sent["text"] and '"status":400' in sent["text"]
