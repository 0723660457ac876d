"""Train RLlib's BC on an rlserve experience log, and read its episodes form back.

Runs where RLlib is installed (not the project's environment: ``pip install
"ray[rllib]==2.60.0" torch``), on a log written by ``rlserve serve`` with
``RLSERVE_EXPERIENCE_LOG=DIR`` (docs/experience.md):

    python scripts/train_bc_on_experience.py DIR --model cartpole [--iterations 1]

1. BC trains on ``DIR/<model>/columns`` (RLlib's columns form) for ``--iterations``
   iterations and prints the learner's loss.
2. Every item of ``DIR/<model>/episodes`` is read as RLlib's reader reads it
   (``msgpack`` + ``msgpack_numpy``, ``SingleAgentEpisode.from_state``) and the episodes'
   lengths are printed, checked against the columns form's transitions per episode.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import gymnasium as gym
import msgpack
import msgpack_numpy
import numpy as np
import pyarrow.parquet as pq
import ray
from ray.rllib.algorithms.bc import BCConfig
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

SPACES = {  # the embedded default policies' spaces
    "cartpole": (gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2)),
    "cartpole-memory": (gym.spaces.Box(-np.inf, np.inf, (2,), np.float32), gym.spaces.Discrete(2)),
}


def train_bc(columns: Path, model: str, iterations: int) -> None:
    observation_space, action_space = SPACES[model]
    config = (
        BCConfig()
        .environment(observation_space=observation_space, action_space=action_space)
        .offline_data(input_=[str(columns)], input_read_method="read_parquet", dataset_num_iters_per_learner=1,
                      # One pre-learner actor: the reading tasks need a CPU of their own.
                      map_batches_kwargs={"concurrency": 1, "num_cpus": 1})
        .training(train_batch_size_per_learner=256, lr=1e-3)
    )
    algo = config.build_algo()
    for iteration in range(iterations):
        result = algo.train()
        learner = result["learners"]["default_policy"]
        print(f"BC iteration {iteration + 1}: loss {learner['total_loss']:.4f}, policy loss "
              f"{learner['policy_loss']:.4f}, trained on {learner['num_module_steps_trained']} steps")
    algo.stop()


def read_episodes(folder: Path) -> Counter:
    lengths: Counter = Counter()
    for path in sorted(folder.glob("*.parquet")):
        for item in pq.read_table(path, columns=["item"]).column("item").to_pylist():
            episode = SingleAgentEpisode.from_state(msgpack.unpackb(item, object_hook=msgpack_numpy.decode))
            episode.to_numpy()
            lengths[episode.id_] += len(episode)
            print(f"episode {episode.id_}: t_started {episode.t_started}, {len(episode)} steps, "
                  f"terminated {episode.is_terminated}, truncated {episode.is_truncated}, "
                  f"return {episode.get_return():.1f}")
    return lengths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--model", default="cartpole", choices=sorted(SPACES))
    parser.add_argument("--iterations", type=int, default=1)
    args = parser.parse_args()
    root = args.log / args.model
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    train_bc(root / "columns", args.model, args.iterations)
    lengths = read_episodes(root / "episodes")
    table = pq.ParquetDataset(root / "columns").read(columns=["eps_id"])
    transitions = Counter(table.column("eps_id").to_pylist())
    same = lengths == transitions
    print(f"{len(lengths)} episodes read back; their lengths equal the columns form's transitions per "
          f"episode: {same}")
    ray.shutdown()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
