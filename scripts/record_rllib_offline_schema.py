"""Record what RLlib's new-stack offline reader expects of the experience log's files.

Run in an environment with RLlib (not the project's: ``pip install "ray[rllib]==2.60.0"
torch``); writes ``tests/fixtures/rllib_offline/schema.json``, which
``tests/service/test_experience_schema.py`` checks both forms against:

- ``columns``: RLlib's column names (``ray.rllib.core.columns.Columns``) and the reader's
  schema (``OfflinePreLearner``'s ``SCHEMA``: these columns are read as such, every other
  one becomes an extra model output);
- ``written_columns``: the Parquet schema of a CartPole recording in RLlib's own columns
  form (``OfflineSingleAgentEnvRunner._map_episodes_to_data`` on episodes RLlib sampled,
  written with Ray Data as RLlib writes it), field name -> Arrow type;
- ``episode_state``: the keys of ``SingleAgentEpisode.get_state()`` and of each
  ``InfiniteLookbackBuffer`` state in it, and the column RLlib reads items from.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
import tempfile
from pathlib import Path

import gymnasium as gym
import numpy as np
import pyarrow.parquet as pq
import ray
from ray.rllib.core.columns import Columns
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.offline import offline_prelearner
from ray.rllib.offline.offline_env_runner import OfflineSingleAgentEnvRunner

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "rllib_offline" / "schema.json"


def cartpole_episodes(count: int = 3) -> list[SingleAgentEpisode]:
    """Episodes as RLlib's env runner fills them (actions with their logp), numpy'd."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(0)
    episodes = []
    for seed in range(count):
        episode = SingleAgentEpisode(observation_space=env.observation_space, action_space=env.action_space)
        obs, info = env.reset(seed=seed)
        episode.add_env_reset(obs, info)
        done = False
        while not done:
            action = int(rng.integers(2))
            obs, reward, terminated, truncated, info = env.step(action)
            episode.add_env_step(obs, action, reward, info, terminated=terminated, truncated=truncated,
                                 extra_model_outputs={Columns.ACTION_LOGP: np.float32(np.log(0.5))})
            done = terminated or truncated
        episode.to_numpy()
        episodes.append(episode)
    return episodes


class _Runner:
    """What ``_map_episodes_to_data`` reads of its runner."""

    output_compress_columns: list[str] = []

    def __init__(self) -> None:
        self._samples: list[dict] = []


def written_columns(episodes: list[SingleAgentEpisode]) -> dict[str, str]:
    runner = _Runner()
    OfflineSingleAgentEnvRunner._map_episodes_to_data(runner, episodes)  # type: ignore[arg-type]
    with tempfile.TemporaryDirectory() as folder:
        ray.data.from_items(runner._samples).write_parquet(folder)
        schema = pq.read_schema(next(Path(folder).glob("*.parquet")))
    return {field.name: str(field.type) for field in schema}


def main() -> int:
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    episodes = cartpole_episodes()
    state = episodes[0].get_state()
    call = inspect.getsource(offline_prelearner.OfflinePreLearner.__call__)
    item_column = re.search(r'batch\["(\w+)"\]', call)
    record = {
        "ray_version": ray.__version__,
        "columns": {name: value for name, value in vars(Columns).items() if name.isupper()},
        "prelearner_schema": dict(offline_prelearner.SCHEMA),
        "written_columns": written_columns(episodes),
        "episode_state": {
            "keys": sorted(state),
            "buffer_keys": sorted(state["observations"]),
            "buffers": sorted(k for k, v in state.items() if isinstance(v, dict) and "lookback" in v),
            "item_column": item_column.group(1) if item_column else None,
            "decoder": "msgpack.unpackb(item, object_hook=msgpack_numpy.decode); SingleAgentEpisode.from_state",
        },
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    print(json.dumps(record, indent=2, sort_keys=True))
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
