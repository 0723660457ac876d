"""The open step of a logged episode: what transition t needs from step t itself.

Transition t of an episode is (obs_t, action_t, logp_t, ..., reward_t, obs_t+1, done): its
first half is known when step t is answered, its second half only when step t+1 arrives
(the client reports the reward with the next observation). The first half travels as the
session's ``trail``, in its record when sessions live in an external store, so
whichever replica serves step t+1 closes transition t: an episode is never cut at a
replica boundary.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

# A session whose current episode is not sampled: its steps are not logged.
NOT_SAMPLED = b"\x00"


class Trail(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """Step t of episode ``eps_id``, as answered. Arrays are packed (``records.packer``:
    raw bytes), so the garbage collector never tracks a trail."""

    eps_id: str
    t: int  # the step's index in its episode (0: the first observation)
    event_id: str
    obs: Any  # the observation as received, packed
    action: Any  # the model's sample in the action space's structure, before unsquash/clip, packed
    env_action: Any  # the action as answered (after unsquash/clip), packed; None: equal to ``action``
    logp: float  # NaN where the distribution defines none (deterministic)
    value: float  # the value estimate, when a request of the batch asked for it (else NaN)
    explore: bool  # False: ``logp`` is the mode's, not a behaviour probability
    version: str
    time: float  # seconds since the epoch, when the step was answered
    # Served through a policy set (``rlserve.service.multiagent``): the agent, and the policy
    # id of the set that acted for it (RLlib's module id); None for a single agent.
    agent_id: str | None = None
    module_id: str | None = None

    def __bytes__(self) -> bytes:
        """What a session's record stores (``rlserve.service.sessions.record``): the trail
        stays an object while its session is held here and is encoded only when written."""
        return _ENCODER.encode(self)


def _encode_value(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise NotImplementedError(f"cannot log a {type(value).__name__}")


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_encode_value)
_DECODER = msgspec.msgpack.Decoder(Trail)


def decode(data: Trail | bytes) -> Trail | None:
    """The trail a session holds (an object, or bytes read from a record); None for
    ``NOT_SAMPLED`` or bytes that are no trail (a record written by another release): the
    episode's next transition is then not logged."""
    if isinstance(data, Trail):
        return data
    if data == NOT_SAMPLED:
        return None
    try:
        return _DECODER.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError):  # msgspec raises the latter for invalid UTF-8
        return None
