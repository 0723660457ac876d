"""The act endpoints over HTTP (in-process): outputs, options, masks, batching, errors."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest
import svc_bundles
import torch
from conftest import error_of

pytestmark = pytest.mark.asyncio

OBS = [0.1, -0.2, 0.3, 0.05]


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    z = x - x.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def eager_dist_inputs(name: str, obs: list) -> np.ndarray:
    """The catalog model (same seed as the exported bundle) run eagerly in torch."""
    model = svc_bundles.build_model(name).eval()
    with torch.no_grad():
        out = model(torch.tensor(np.asarray(obs, np.float32)))
    return out[0].numpy()


async def test_single_observation(make_client):
    _, client = make_client(("mlp",))
    r = await client.post(
        "/v1/models/mlp/act", json={"observation": OBS, "outputs": ["value", "entropy", "dist_inputs"]}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "mlp" and body["version"] == "1" and body["explore"] is True
    assert body["action"] in (0, 1, 2)
    dist_inputs = np.asarray(body["dist_inputs"])
    np.testing.assert_allclose(dist_inputs, eager_dist_inputs("mlp", [OBS])[0], rtol=1e-5, atol=1e-6)
    assert body["logp"] == pytest.approx(log_softmax(dist_inputs)[body["action"]], rel=1e-5)
    p = np.exp(log_softmax(dist_inputs))
    assert body["entropy"] == pytest.approx(-(p * np.log(p)).sum(), rel=1e-5)
    assert isinstance(body["value"], float)


async def test_batch_deterministic_is_argmax(make_client):
    _, client = make_client(("mlp",))
    rng = np.random.default_rng(0)
    obs = rng.uniform(-1, 1, (6, 4)).round(3).tolist()
    r = await client.post(
        "/v1/models/mlp/act", json={"observations": obs, "explore": False, "outputs": ["dist_inputs"]}
    )
    body = r.json()
    expected = eager_dist_inputs("mlp", obs)
    np.testing.assert_allclose(body["dist_inputs"], expected, rtol=1e-5, atol=1e-6)
    assert body["actions"] == expected.argmax(axis=1).tolist()
    np.testing.assert_allclose(body["logp"], log_softmax(expected).max(axis=1), rtol=1e-5)
    assert "value" not in body and "entropy" not in body


async def test_raw_path_and_fastapi_route_agree(make_client):
    _, fast = make_client(("mlp",))
    _, routed = make_client(("mlp",), fast_act_path=False)
    payload = {"observations": [OBS, OBS], "explore": False, "outputs": ["value"]}
    a, b = await fast.post("/v1/models/mlp/act", json=payload), await routed.post("/v1/models/mlp/act", json=payload)
    assert a.status_code == b.status_code == 200 and a.json() == b.json()
    bad = {"observation": [1, 2]}
    ea, eb = await fast.post("/v1/models/mlp/act", json=bad), await routed.post("/v1/models/mlp/act", json=bad)
    assert ea.status_code == eb.status_code == 422 and error_of(ea) == error_of(eb)


async def test_pinned_version_route(make_client):
    _, client = make_client(("mlp",))
    r = await client.post("/v1/models/mlp/versions/1/act", json={"observation": OBS})
    assert r.status_code == 200 and r.json()["version"] == "1"
    r = await client.post("/v1/models/mlp/versions/7/act", json={"observation": OBS})
    assert r.status_code == 404 and error_of(r)["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        (b"{nope", 400, "invalid_json", None),
        (b'{"observation": [0,0,0,0], "unknown": 1}', 400, "bad_request", "unknown"),
        (b'{"observation": [0,0,0]}', 422, "invalid_input", "observation"),
        (b'{"observations": [[0,0,0,0], [0,0]]}', 422, "invalid_input", "observations[1]"),
        (b'{"observation": [0,0,0,"x"]}', 422, "invalid_input", "observation"),
        (b'{"observation": {"b64": "AAAA", "shape": [4]}}', 422, "invalid_input", "observation.b64"),
        (b'{"observation": [0,0,0,0], "action_mask": [1, 1]}', 422, "invalid_input", "action_mask"),
        (b'{"observation": [0,0,0,0], "action_mask": [0, 0, 0]}', 422, "all_actions_masked", "action_mask"),
        (b'{"observation": [0,0,0,0], "session_id": ""}', 400, "bad_request", "session_id"),
    ],
)
async def test_bad_requests_get_json_errors(make_client, body, status, code, field):
    _, client = make_client(("mlp",))
    r = await client.post("/v1/models/mlp/act", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    error = error_of(r)
    assert error["code"] == code and error["field"] == field
    # The server is still fine afterwards.
    assert (await client.post("/v1/models/mlp/act", json={"observation": OBS})).status_code == 200


async def test_unknown_model_is_404(make_client):
    _, client = make_client(("mlp",))
    r = await client.post("/v1/models/nope/act", json={"observation": OBS})
    assert r.status_code == 404 and error_of(r)["code"] == "model_not_found"


async def test_explicit_mask_is_respected(make_client):
    _, client = make_client(("mlp",))
    obs = [OBS] * 200
    r = await client.post(
        "/v1/models/mlp/act", json={"observations": obs, "action_masks": [[0, 1, 0]] * 100 + [[1, 0, 1]] * 100}
    )
    actions = r.json()["actions"]
    assert set(actions[:100]) == {1} and set(actions[100:]) <= {0, 2} and len(set(actions[100:])) == 2
    # The masked action has logp 0 under the renormalised distribution (it is certain).
    assert r.json()["logp"][0] == pytest.approx(0.0, abs=1e-6)


async def test_mask_in_dict_observation(make_client):
    _, client = make_client(("masked",))
    rng = np.random.default_rng(3)
    mask = [0, 1, 1, 0, 1]  # MultiDiscrete([2, 3]): component 0 -> {1}; component 1 -> {0, 2}
    obs = [{"action_mask": mask, "observations": rng.uniform(-1, 1, 3).tolist()} for _ in range(100)]
    r = await client.post("/v1/models/masked/act", json={"observations": obs})
    actions = np.asarray(r.json()["actions"])
    assert set(actions[:, 0]) == {1} and set(actions[:, 1]) == {0, 2}
    bad = {"observation": {"action_mask": [1, 1, 0, 0, 0], "observations": [0, 0, 0]}}
    r = await client.post("/v1/models/masked/act", json=bad)
    assert r.status_code == 422 and error_of(r)["code"] == "all_actions_masked"
    assert error_of(r)["field"] == "observation.action_mask"


async def test_mask_on_continuous_actions_is_rejected(make_client):
    _, client = make_client(("image",))
    img = np.zeros((10, 10, 3), np.uint8).tolist()
    r = await client.post("/v1/models/image/act", json={"observation": img, "action_mask": [1, 1]})
    assert r.status_code == 422 and "categorical" in error_of(r)["message"]


async def test_base64_image_and_action_postprocessing(make_client):
    _, client = make_client(("image",))
    img = (np.random.default_rng(0).integers(0, 4, (10, 10, 3))).astype(np.uint8)
    packed = {"b64": base64.b64encode(img.tobytes()).decode(), "dtype": "uint8", "shape": [10, 10, 3]}
    raw = (await client.post("/v1/models/image/act", json={"observation": packed, "explore": False})).json()["action"]
    listed = (await client.post("/v1/models/image/act", json={"observation": img.tolist(), "explore": False})).json()[
        "action"
    ]
    assert raw == listed
    low, high = np.array([-2.0, -2.0]), np.array([3.0, 3.0])
    clipped = (
        await client.post("/v1/models/image/act", json={"observation": packed, "explore": False, "clip_actions": True})
    ).json()
    np.testing.assert_allclose(clipped["action"], np.clip(raw, low, high), rtol=1e-6)
    unsq = (
        await client.post(
            "/v1/models/image/act", json={"observation": packed, "explore": False, "unsquash_actions": True}
        )
    ).json()
    expected = np.clip(low + (np.asarray(raw) + 1.0) * (high - low) / 2.0, low, high)
    np.testing.assert_allclose(unsq["action"], expected, rtol=1e-5)
    assert clipped["logp"] == unsq["logp"]  # logp is of the raw action


async def test_seeded_sessions_replay(make_client):
    _, client = make_client(("mlp",))
    rng = np.random.default_rng(1)
    trajectory = rng.uniform(-1, 1, (20, 4)).round(3).tolist()

    async def episode(session_id: str, seed: int) -> list[int]:
        actions = []
        for t, obs in enumerate(trajectory):
            r = await client.post("/v1/models/mlp/act", json={"observation": obs, "session_id": session_id,
                                                                "episode_start": t == 0, "seed": seed})
            actions.append(r.json()["action"])
        return actions

    first, noise = await asyncio.gather(episode("a", 5), episode("noise", 9))
    replay = await episode("b", 5)
    assert first == replay
    assert noise != first  # 3**-20 chance of a false alarm
    again = await episode("a", 5)  # episode_start with the seed restarts the same stream
    assert again == first


async def test_a_seeded_episode_replays_inside_full_batches(make_client):
    """A seeded session's rows drawn in batches of 30 rows (the distribution's numpy path,
    beside unseeded and other seeded sessions) are the actions it draws alone."""
    _, client = make_client(("mlp",), max_batch_size=64, max_batch_delay_ms=20)
    trajectory = np.random.default_rng(2).uniform(-1, 1, (12, 4)).round(3).tolist()

    async def episode(session_id: str, seed: int | None) -> tuple[list[int], list[int]]:
        actions, rows = [], []
        for t, obs in enumerate(trajectory):
            body = {"observation": obs, "session_id": session_id, "episode_start": t == 0, "debug": True}
            if seed is not None and t == 0:
                body["seed"] = seed
            answer = (await client.post("/v1/models/mlp/act", json=body)).json()
            actions.append(answer["action"])
            rows.append(answer["debug"]["batch_rows"])
        return actions, rows

    crowd = await asyncio.gather(*(episode(f"s{i}", 100 + i if i % 2 else None) for i in range(30)))
    assert max(max(rows) for _, rows in crowd) > 8  # 4 logits a row: past the Python-float block
    alone = [await episode(f"again{i}", 100 + i) for i in (1, 7, 13)]
    assert [actions for actions, _ in alone] == [crowd[i][0] for i in (1, 7, 13)]
    assert all(max(rows) == 1 for _, rows in alone)


async def test_concurrent_sessions_are_served_by_one_batch(make_client):
    _, client = make_client(("lstm",), max_batch_size=4, max_batch_delay_ms=5000)
    payloads = [{"observation": OBS, "session_id": f"s{i}", "episode_start": True, "debug": True} for i in range(4)]
    responses = await asyncio.gather(*(client.post("/v1/models/lstm/act", json=p) for p in payloads))
    debug = [r.json()["debug"] for r in responses]
    assert len({d["batch_id"] for d in debug}) == 1
    assert all(d["batch_requests"] == 4 and d["batch_rows"] == 4 for d in debug)
    assert [r.json()["session_id"] for r in responses] == ["s0", "s1", "s2", "s3"]


async def test_full_queue_answers_503_with_retry_after(make_client):
    app, client = make_client(("mlp",), max_batch_size=100, max_batch_delay_ms=2000, queue_limit=2, retry_after_s=3)
    batcher = app.state.registry.entry("mlp").policy().batcher
    first = [asyncio.ensure_future(client.post("/v1/models/mlp/act", json={"observation": OBS})) for _ in range(2)]
    while batcher.queued_rows < 2:  # both wait out the batch delay in the queue
        await asyncio.sleep(0)
    r = await client.post("/v1/models/mlp/act", json={"observation": OBS})
    assert r.status_code == 503 and r.headers["retry-after"] == "3"
    assert error_of(r)["code"] == "queue_full"
    assert [f.status_code for f in await asyncio.gather(*first)] == [200, 200]


async def test_failing_batch_fails_only_its_requests(make_client):
    app, client = make_client(("mlp",), max_batch_size=2, max_batch_delay_ms=200)
    policy = app.state.registry.entry("mlp").policy()
    real_run = policy.runtime.run

    def flaky(inputs, **options):
        if np.any(inputs["obs"][:, 0] == 0.5):
            raise RuntimeError("device fault")
        return real_run(inputs, **options)

    policy.runtime.run = flaky
    poisoned = [client.post("/v1/models/mlp/act", json={"observation": [0.5, 0, 0, 0]}),
                client.post("/v1/models/mlp/act", json={"observation": OBS})]
    responses = await asyncio.gather(*poisoned)
    assert [r.status_code for r in responses] == [500, 500]
    assert error_of(responses[0])["code"] == "batch_failed"
    healthy = await asyncio.gather(*(client.post("/v1/models/mlp/act", json={"observation": OBS}) for _ in range(2)))
    assert [r.status_code for r in healthy] == [200, 200]


async def test_batching_off_still_serves(make_client):
    _, client = make_client(("mlp",), batching=False)
    responses = await asyncio.gather(
        *(client.post("/v1/models/mlp/act", json={"observation": OBS, "debug": True}) for _ in range(3))
    )
    assert {r.json()["debug"]["batch_requests"] for r in responses} == {1}


async def test_torchscript_runtime_gives_the_same_answers(make_client):
    _, onnx_client = make_client(("mlp",), runtime="onnx")
    _, ts_client = make_client(("mlp",), runtime="torchscript")
    payload = {"observations": [OBS, [0.9, 0.1, -0.4, 0.0]], "explore": False, "outputs": ["dist_inputs", "value"]}
    a = (await onnx_client.post("/v1/models/mlp/act", json=payload)).json()
    b = (await ts_client.post("/v1/models/mlp/act", json=payload)).json()
    assert a["actions"] == b["actions"]
    np.testing.assert_allclose(a["dist_inputs"], b["dist_inputs"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a["value"], b["value"], rtol=1e-5, atol=1e-6)
    meta = (await ts_client.get("/v1/models/mlp")).json()
    assert meta["runtime"]["kind"] == "torchscript"


@pytest.mark.parametrize("fast", [True, False])
async def test_oversized_body_is_413(make_client, fast):
    _, client = make_client(("mlp",), max_body_bytes=2048, fast_act_path=fast)
    r = await client.post("/v1/models/mlp/act", json={"observations": [OBS] * 200})
    assert r.status_code == 413 and error_of(r)["code"] == "payload_too_large"
    assert (await client.post("/v1/models/mlp/act", json={"observation": OBS})).status_code == 200
