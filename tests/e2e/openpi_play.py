"""A robot's side of the openpi route: openpi's own client, run in its environment (numpy<2).

    python openpi_play.py URI ROOT_HOST ROOT_PORT   (tests/openpi_venv.py's interpreter)

Plays seeded CartPole episodes through ``WebsocketClientPolicy`` at ``URI`` (one connection;
each episode after the first starts with ``episode_start`` and its own seed in the dict),
sends bad observations on the same connection, and connects to the server's root path as
``WebsocketClientPolicy(host, port)`` does. Prints one JSON object with what it saw.
"""

from __future__ import annotations

import json
import sys

import gymnasium as gym
import numpy as np
from openpi_client.websocket_client_policy import WebsocketClientPolicy

SEEDS = (7, 8)  # one sampler seed per episode
MAX_STEPS = 120  # a whole episode of a good policy is 500 steps: truncated here, said so


def play(policy: WebsocketClientPolicy, seed: int, first: bool) -> dict:
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    steps, reward, done, ended = [], None, False, "max_steps"
    while not done and len(steps) < MAX_STEPS:
        message = {"observation": obs, "prompt": "balance the pole"}  # a key the model does not read
        if not steps and not first:
            message.update(episode_start=True, seed=seed)
        elif steps:
            message["reward"] = reward
        answer = policy.infer(message)
        actions = answer["actions"]
        assert isinstance(actions, np.ndarray) and actions.shape == () and actions.dtype == np.int64, actions
        steps.append({"observation": obs.tolist(), "action": int(actions), "logp": answer["logp"],
                      "infer_ms": answer["server_timing"]["infer_ms"], "session_id": answer["session_id"]})
        obs, reward, terminated, truncated, _ = env.step(int(actions))
        done = terminated or truncated
        ended = "terminated" if terminated else "truncated" if truncated else ended
    return {"seed": seed, "steps": steps, "ended": ended}


def refusal(policy: WebsocketClientPolicy, message: dict) -> dict:
    try:
        policy.infer(message)
    except RuntimeError as exc:
        text = str(exc)
        return json.loads(text[text.index("{"):])
    raise AssertionError(f"{message} was answered")


def main() -> None:
    uri, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    policy = WebsocketClientPolicy(uri)
    out = {"metadata": policy.get_server_metadata()}
    out["episodes"] = [play(policy, seed, i == 0) for i, seed in enumerate(SEEDS)]
    good = np.zeros(4, np.float32)
    out["missing"] = refusal(policy, {"state": good})
    out["shape"] = refusal(policy, {"observation": np.zeros(3, np.float32)})
    out["after"] = int(policy.infer({"observation": good})["actions"])  # the connection is still open
    root = WebsocketClientPolicy(host, port)  # ws://host:port: RLSERVE_OPENPI_MODEL's model
    out["root_metadata"] = root.get_server_metadata()
    out["root_action"] = int(root.infer({"observation": good})["actions"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
