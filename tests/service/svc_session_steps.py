"""The steps the store-backed session tests drive (test_svc_session_store.py,
test_svc_session_store_requests.py): seeded observations, one session step, an episode
stepped across replicas, and two replicas partway through an episode on one store.
"""

from __future__ import annotations

import numpy as np


def observations(seed: int, steps: int, dim: int = 4) -> list[list[float]]:
    return np.random.default_rng(seed).uniform(-1, 1, (steps, dim)).round(4).tolist()


async def step(client, model, sid, obs, t, **extra):
    body = {"observation": obs, "session_id": sid, **extra}
    if t == 0:
        body["episode_start"] = True
        body["seed"] = 17
    else:
        body["reward"] = 0.5 * t
    return await client.post(f"/v1/models/{model}/act", json=body)


async def episode(clients, model, sid, obs_list, **extra) -> list:
    """Step ``sid`` through ``obs_list``, the t-th step on ``clients[t % len(clients)]``."""
    actions = []
    for t, obs in enumerate(obs_list):
        r = await step(clients[t % len(clients)], model, sid, obs, t, **extra)
        assert r.status_code == 200, r.text
        actions.append(r.json()["action"])
    return actions


async def two_replicas_partway(make_client, store: dict, seed: int, sid: str, steps: int = 6, done: int = 3):
    """An in-process reference episode of ``steps`` steps, and two replicas a and b sharing
    ``store`` that have alternated (a first) through its first ``done`` steps, equal to it.
    Returns (a, b, observations, the reference's actions)."""
    _, reference = make_client(("lstm",))
    obs = observations(seed, steps)
    expected = await episode([reference], "lstm", sid, obs)
    _, a = make_client(("lstm",), **store)
    _, b = make_client(("lstm",), **store)
    assert await episode([a, b], "lstm", sid, obs[:done]) == expected[:done]
    return a, b, obs, expected
