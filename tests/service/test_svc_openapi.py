"""What the OpenAPI document promises, checked against the app answering in-process.

tests/e2e/test_openapi_conformance.py runs schemathesis over the whole document against a
real server; these pin the individual promises it relies on.
"""

from __future__ import annotations

import jsonschema_rs
import pytest
from conftest import error_of

pytestmark = pytest.mark.asyncio

OBS = [0.1, -0.2, 0.3, 0.05]
ERROR_REF = "#/components/schemas/ErrorResponse"


async def test_every_documented_error_has_the_error_body_and_fastapis_422_is_gone(make_client):
    _, client = make_client(("mlp",), admin_token="t")
    spec = (await client.get("/openapi.json")).json()
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    documented = {}
    for path, operations in spec["paths"].items():
        if path == "/v2" or path.startswith("/v2/"):
            continue  # the Open Inference Protocol's own error shape (tests/service/test_svc_kserve_v2.py)
        for method, operation in operations.items():
            codes = {code for code in operation["responses"] if code.startswith(("4", "5"))}
            documented[f"{method.upper()} {path}"] = codes
            for code in codes - {"503"} if path == "/readyz" else codes:
                schema = operation["responses"][code]["content"]["application/json"]["schema"]
                assert schema == {"$ref": ERROR_REF}, (method, path, code)
    assert documented["POST /v1/models/{name}/act"] == {"400", "404", "409", "410", "413", "422", "500", "503"}
    assert documented["POST /v1/models/{name}/sessions"] == {"400", "404", "409", "413", "503"}
    # Under an external store a lookup may find the store down (503) or a record it cannot read (500).
    assert documented["GET /v1/models/{name}/sessions/{session_id}"] == {"404", "410", "500", "503"}
    assert documented["DELETE /v1/models/{name}/sessions/{session_id}"] == {"404", "410", "500", "503"}
    assert documented["PUT /v1/models/{name}/sessions/{session_id}"] == {"400", "404", "409", "413", "422", "503"}
    assert documented["POST /v1/admin/models"] == {"400", "401", "403", "404", "409", "413", "422"}
    assert documented["DELETE /v1/admin/models/{name}"] == {"401", "403", "404"}
    assert documented["GET /v1/models/{name}"] == {"404"}
    assert documented["GET /readyz"] == {"503"}
    assert spec["paths"]["/v1/admin/models"]["get"]["security"] == [{"HTTPBearer": []}]


async def test_the_act_request_schema_states_the_two_forms(make_client):
    _, client = make_client(("mlp",))
    spec = (await client.get("/openapi.json")).json()
    # The schema refers to its components (ObservationBlock): validate inside the document.
    schema = {"$ref": "#/components/schemas/ActRequest", "components": spec["components"]}
    valid = jsonschema_rs.validator_for(schema).is_valid
    assert valid({"observation": OBS}) and valid({"observations": [OBS], "session_ids": ["a"], "seeds": [1]})
    block = {"b64": "AAAAAA==", "dtype": "float32", "shape": [1, 1]}
    assert valid({"observations": block, "explore": False})
    assert not valid({"observations": {**block, "dtype": "complex64"}})
    assert not valid({"observations": {**block, "extra": 1}})
    assert valid({"observation": OBS, "session_id": "a", "seed": 3, "session_ids": None})
    for body in ({}, {"explore": True}, {"observation": OBS, "observations": [OBS]}, {"observations": []},
                 {"observation": OBS, "seeds": [1]}, {"observations": [OBS], "seed": 1},
                 {"observations": [OBS], "prev_action": None}, {"observations": [OBS], "episode_start": True},
                 {"observation": OBS, "session_id": ""}, {"observation": OBS, "session_id": "x" * 129}):
        assert not valid(body), body


@pytest.mark.parametrize("path, allow", [
    ("/v1/models/mlp/act", "POST"),
    ("/v1/models/mlp/sessions", "POST"),
    ("/v1/models/mlp/sessions/a%2Fb", "GET, PUT, DELETE"),  # three routes share the path
    ("/v1/models/mlp", "GET"),
    ("/v1/admin/models", "GET, POST"),
    ("/openapi.json", "GET, HEAD"),
])
async def test_405_names_every_method_of_the_path_in_allow(make_client, path, allow):
    _, client = make_client(("mlp",))
    for method in {"PUT", "PATCH", "TRACE", "OPTIONS"} - set(allow.split(", ")):
        r = await client.request(method, path)
        assert r.status_code == 405 and error_of(r)["code"] == "method_not_allowed"
        assert r.headers["allow"] == allow, (method, path)


async def test_a_whole_float_seed_is_the_integer_it_spells(make_client):
    # JSON Schema's "integer" takes 7.0; the server does too, on every route with a seed.
    _, client = make_client(("lstm",))
    r = await client.post("/v1/models/lstm/sessions", json={"session_id": "s", "seed": 7.0})
    assert r.status_code == 201 and r.json()["seed"] == 7
    for body in ({"observation": OBS, "session_id": "t", "episode_start": True, "seed": 7.0},
                 {"observations": [OBS], "session_ids": ["u"], "episode_starts": [True], "seeds": [7.0]}):
        assert (await client.post("/v1/models/lstm/act", json=body)).status_code == 200, body
    for seed in (7.5, -1.0, "7", True):
        r = await client.post("/v1/models/lstm/sessions", json={"seed": seed})
        assert r.status_code == 400 and error_of(r)["field"] == "seed", seed
        r = await client.post("/v1/models/lstm/act", json={"observation": OBS, "seed": seed})
        assert r.status_code == 400 and error_of(r)["field"] == "seed", seed
