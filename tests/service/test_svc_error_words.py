"""Refusals speak the client's language (JSON's), on the act route and the Open Inference
Protocol's infer: what is no number, and where; a NaN token is said to be no JSON; never
numpy's dtype codes ('U', 'O', 'str672'). The bodies stay small."""

from __future__ import annotations

import httpx
import pytest
import pytest_asyncio

from rlserve.service.app import create_app
from rlserve.service.settings import Settings

pytestmark = pytest.mark.asyncio
NUMPY_WORDS = ("dtype", "type 'U'", "type 'O'", "str672", "<U", "object")


@pytest_asyncio.fixture
async def client():
    app = create_app(Settings())  # the embedded default policies
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        yield c


def _act(body: bytes | dict) -> dict:
    return {"content": body} if isinstance(body, bytes) else {"json": body}


@pytest.mark.parametrize(("body", "status", "said"), [
    ({"observation": [0.1, 0.2, "nan", 0.4]}, 422,
     "observation: expected finite numbers; element 2 is the string 'nan'"),
    ({"observation": [0.1, None, 0.3, 0.4]}, 422, "observation: expected finite numbers; element 1 is null"),
    ({"observations": [[0.0] * 4, [0.1, 0.2, 0.3, "x"]]}, 422,
     "observations[1]: expected finite numbers; element 3 is the string 'x'"),
    (b'{"observation": [0.1, NaN, 0.3, 0.4]}', 400, "values must be finite JSON numbers (JSON has no NaN or Infinity)"),
    (b'{"observation": [0.1, -Infinity, 0.3, 0.4]}', 400, "-Infinity"),
])
async def test_act_refusals(client, body, status, said):
    r = await client.post("/v1/models/cartpole/act", **_act(body))
    assert r.status_code == status, r.text
    message = r.json()["error"]["message"]
    assert said in message, message
    assert not any(word in message for word in NUMPY_WORDS), message
    assert len(r.content) < 2048


def _infer(data: list) -> dict:
    return {"inputs": [{"name": "obs", "datatype": "FP32", "shape": [1, 4], "data": data}]}


@pytest.mark.parametrize(("body", "said"), [
    (_infer([0.1, "nan", 0.3, 0.4]), "'data' of FP32 must hold finite numbers; element 1 is the string 'nan'"),
    (_infer([0.1, 0.2, None, 0.4]), "'data' of FP32 must hold finite numbers; element 2 is null"),
    (_infer([[0.1, 0.2], [0.3, "s" * 500]]), "element [1, 1] is a string of 500 characters"),
    (b'{"inputs": [{"name": "obs", "datatype": "FP32", "shape": [1, 4], "data": [0.1, NaN, 0.3, 0.4]}]}',
     "values must be finite JSON numbers"),
])
async def test_infer_refusals(client, body, said):
    r = await client.post("/v2/models/cartpole/infer", **_act(body))
    assert r.status_code == 400, r.text
    message = r.json()["error"]
    assert said in message, message
    assert not any(word in message for word in NUMPY_WORDS), message
    assert len(r.content) < 2048
