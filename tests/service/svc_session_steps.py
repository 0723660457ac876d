"""The steps the store-backed session tests drive (test_svc_session_store.py,
test_svc_session_store_requests.py): seeded observations, one session step, an episode
stepped across replicas, two replicas partway through an episode on one store, and an
exported session record with a forged kept answer.
"""

from __future__ import annotations

import msgpack
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


def forge_answer(exported: bytes, answer: list) -> bytes:
    """``exported`` (an exported session record, format 1) with its kept answer replaced by
    ``answer`` as msgpack, the header's answer length (offset 36) set to match."""
    answer_len = int.from_bytes(exported[36:40], "little")
    end = len(exported) - int.from_bytes(exported[76:80], "little")  # the kept answer ends where the trail starts
    data = msgpack.packb(answer)
    header = exported[:36] + len(data).to_bytes(4, "little") + exported[40:80]
    return header + exported[80:end - answer_len] + data + exported[end:]
