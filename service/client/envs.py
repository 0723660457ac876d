"""Gymnasium environments the embedded default policies play.

``rlserve/CartPoleNoVelocity-v1`` is CartPole-v1 with the two velocity entries removed
from the observation (cart position and pole angle remain). A feedforward policy cannot
infer the velocities from one frame, so it needs memory: the LSTM default policy shows
that server-side recurrent state works.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

NO_VELOCITY_ID = "rlserve/CartPoleNoVelocity-v1"
KEPT_ENTRIES = (0, 2)  # cart position, pole angle

# Which environment each embedded default policy was trained on.
DEFAULT_POLICY_ENVS = {
    "cartpole": "CartPole-v1",
    "cartpole-memory": NO_VELOCITY_ID,
}


class DropVelocity(gym.ObservationWrapper):
    """Keep only cart position and pole angle of a CartPole observation."""

    def __init__(self, env: gym.Env):
        """Wrap a CartPole ``env``; the observation space keeps CartPole's bounds of the two entries."""
        super().__init__(env)
        box = env.observation_space
        assert isinstance(box, gym.spaces.Box)  # CartPole's observation space
        idx = list(KEPT_ENTRIES)
        self.observation_space = gym.spaces.Box(box.low[idx], box.high[idx], dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        """The (cart position, pole angle) entries of a CartPole observation, as float32."""
        return np.asarray(observation, dtype=np.float32)[list(KEPT_ENTRIES)]


def _make_no_velocity(**kwargs: Any) -> gym.Env:
    return DropVelocity(gym.make("CartPole-v1", **kwargs))


def register_envs() -> None:
    """Register the project's environment ids with gymnasium (idempotent)."""
    if NO_VELOCITY_ID not in gym.registry:
        gym.register(id=NO_VELOCITY_ID, entry_point=_make_no_velocity, max_episode_steps=None)


def make_env(env_id: str, **kwargs: Any) -> gym.Env:
    """``gym.make(env_id, **kwargs)``, with the project's environment ids registered first."""
    register_envs()
    return gym.make(env_id, **kwargs)
