"""Binary observation blocks against a real `rlserve serve` (embedded cartpole model):
the raw application/octet-stream body through the act protocol and through the raw ASGI
handler, and base64 blocks in JSON, answer as JSON lists do; a bad block is a 422 naming
the row, and the server keeps serving."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from tests.e2e.server_process import running_server

pytestmark = pytest.mark.e2e

ACT = "/v1/models/cartpole/act"
ROWS = np.random.default_rng(5).uniform(-0.2, 0.2, (64, 4)).astype(np.float32)
RAW = {"content-type": "application/octet-stream", "x-rlserve-dtype": "float32", "x-rlserve-shape": "64,4",
       "x-rlserve-explore": "false", "x-rlserve-outputs": "value"}


@pytest.fixture(scope="module", params=["protocol", "asgi"])
def url(request) -> Iterator[str]:
    env = {} if request.param == "protocol" else {"RLSERVE_ACT_PROTOCOL": "false"}
    with running_server(env=env) as base:
        yield base


def test_raw_and_base64_blocks_answer_like_json_lists(url):
    with httpx.Client(base_url=url, timeout=30) as client:
        lists = client.post(ACT, json={"observations": ROWS.tolist(), "explore": False, "outputs": ["value"]})
        raw = client.post(ACT, content=ROWS.tobytes(), headers=RAW)
        b64 = client.post(ACT, json={"observations": {"b64": base64.b64encode(ROWS.tobytes()).decode(),
                                                      "dtype": "float32", "shape": [64, 4]},
                                     "explore": False, "outputs": ["value"]})
    assert lists.status_code == raw.status_code == b64.status_code == 200, raw.text
    assert raw.json() == lists.json() == b64.json()
    assert len(raw.json()["actions"]) == 64 and len(raw.json()["value"]) == 64


def test_a_bad_block_is_a_422_naming_the_row_and_the_server_keeps_serving(url):
    bad = ROWS.copy()
    bad[17, 3] = np.nan
    with httpx.Client(base_url=url, timeout=30) as client:
        refused = client.post(ACT, content=bad.tobytes(), headers=RAW)
        short = client.post(ACT, content=ROWS.tobytes()[:-4], headers=RAW)
        after = client.post(ACT, content=ROWS.tobytes(), headers=RAW)
    assert refused.status_code == 422 and "row 17 index [3]" in refused.json()["error"]["message"]
    assert short.status_code == 422 and short.json()["error"]["field"] == "body"
    assert after.status_code == 200
