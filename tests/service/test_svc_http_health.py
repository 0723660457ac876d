"""Health, readiness, metrics, OpenAPI and the JSON error shape of unknown routes."""

from __future__ import annotations

import pytest
from conftest import error_of

from rlserve.service.app import create_app
from rlserve.service.settings import Settings

pytestmark = pytest.mark.asyncio

OBS = [0.1, -0.2, 0.3, 0.05]


async def test_health_and_readiness(make_client):
    _, client = make_client(("mlp", "lstm"))
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = (await client.get("/readyz")).json()
    assert ready["ready"] is True and ready["models"] == {"mlp": "1", "lstm": "1"}


async def test_not_ready_without_models(tmp_path):
    import httpx

    app = create_app(Settings(repository=tmp_path))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        r = await client.get("/readyz")
        assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
        assert (await client.get("/healthz")).status_code == 200


async def test_metrics_count_requests_batches_sessions_errors(make_client):
    _, client = make_client(("mlp", "lstm"))
    await client.post("/v1/models/mlp/act", json={"observations": [OBS, OBS, OBS]})
    await client.post("/v1/models/lstm/act", json={"observation": OBS, "session_id": "a", "episode_start": True})
    await client.post("/v1/models/mlp/act", json={"observation": [1]})
    text = (await client.get("/metrics")).text
    assert 'rlserve_request_latency_seconds_count{model="mlp",route="act"} 1.0' in text
    assert 'rlserve_batch_size_rows_sum{model="mlp"} 3.0' in text
    assert 'rlserve_queue_time_seconds_count{model="lstm"} 1.0' in text
    assert 'rlserve_active_sessions{model="lstm",version="1"} 1.0' in text
    assert 'rlserve_errors_total{code="invalid_input",status="422"} 1.0' in text
    assert 'rlserve_observations_total{model="mlp"} 3.0' in text


async def test_queued_rows_gauge_counts_what_waits_for_a_batch(make_client):
    """The autoscaling signal (docker/kubernetes/overlays/queue-hpa): rows accepted and not yet
    in a batch. A 2 s batch delay holds a 3-row request in the queue until it is seen."""
    import asyncio

    app, client = make_client(("mlp",), max_batch_delay_ms=2000.0)
    queued = 'rlserve_queued_rows{model="mlp",version="1"}'
    assert f"{queued} 0.0" in (await client.get("/metrics")).text
    act = asyncio.create_task(client.post("/v1/models/mlp/act", json={"observations": [OBS, OBS, OBS]}))
    for _ in range(150):
        if f"{queued} 3.0" in app.state.metrics.render().decode():
            break
        await asyncio.sleep(0.01)
    else:
        pytest.fail("the 3 queued rows never showed in rlserve_queued_rows")
    assert (await act).status_code == 200
    assert f"{queued} 0.0" in (await client.get("/metrics")).text


async def test_openapi_documents_the_act_routes(make_client):
    _, client = make_client(("mlp",))
    spec = (await client.get("/openapi.json")).json()
    act = spec["paths"]["/v1/models/{name}/act"]["post"]
    schema = act["requestBody"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/ActRequest"}
    fields = spec["components"]["schemas"]["ActRequest"]["properties"]
    assert {"observation", "observations", "session_id", "action_mask", "explore"} <= set(fields)
    assert "/v1/models/{name}/versions/{version}/act" in spec["paths"]
    assert "422" in act["responses"] and "ErrorResponse" in spec["components"]["schemas"]


async def test_unknown_routes_and_methods_use_the_error_shape(make_client):
    _, client = make_client(("mlp",))
    r = await client.get("/nowhere")
    assert r.status_code == 404 and error_of(r)["code"] == "not_found"
    r = await client.get("/v1/models/mlp/act")
    assert r.status_code == 405 and error_of(r)["code"] == "method_not_allowed"


async def test_model_listing_and_metadata(make_client):
    _, client = make_client(("mlp", "lstm"))
    listing = (await client.get("/v1/models")).json()
    assert sorted(m["name"] for m in listing["models"]) == ["lstm", "mlp"]
    meta = (await client.get("/v1/models/lstm")).json()
    assert meta["state"][0]["shape"] == [8] and meta["prev"]["n_prev_actions"] == 1
    assert meta["action_space"]["type"] == "Box"
    r = await client.get("/v1/models/nope")
    assert r.status_code == 404 and error_of(r)["code"] == "model_not_found"
