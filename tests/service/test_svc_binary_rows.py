"""Observation rows as one binary block (base64 in JSON, or a raw octet-stream body):
the same answers as JSON lists, one validation for the block, errors naming the row."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from conftest import error_of

from rlserve.service.act import binary
from rlserve.service.step.sizes import Expect

pytestmark = pytest.mark.asyncio

ROWS = np.random.default_rng(3).uniform(-1, 1, (5, 4)).astype(np.float32)


def block(arr: np.ndarray, **override) -> dict:
    return {"b64": base64.b64encode(arr.tobytes()).decode(), "dtype": arr.dtype.name, "shape": list(arr.shape),
            **override}


def raw_headers(arr: np.ndarray, **extra: str) -> dict:
    return {"content-type": "application/octet-stream", "x-rlserve-dtype": arr.dtype.name,
            "x-rlserve-shape": ",".join(map(str, arr.shape)), **extra}


async def _three_forms(client, arr: np.ndarray, outputs: list[str]):
    lists = await client.post("/v1/models/mlp/act", json={"observations": arr.tolist(), "explore": False,
                                                         "outputs": outputs})
    b64 = await client.post("/v1/models/mlp/act", json={"observations": block(arr), "explore": False,
                                                       "outputs": outputs})
    raw = await client.post("/v1/models/mlp/act", content=arr.tobytes(),
                            headers=raw_headers(arr, **{"x-rlserve-explore": "false",
                                                        "x-rlserve-outputs": ",".join(outputs)}))
    return lists, b64, raw


@pytest.mark.parametrize("fast_path", [True, False])
async def test_every_form_gets_the_answer_of_json_lists(make_client, fast_path):
    _, client = make_client(("mlp",), fast_act_path=fast_path)
    answers = await _three_forms(client, ROWS, ["value", "entropy"])
    assert [r.status_code for r in answers] == [200, 200, 200], [r.text for r in answers]
    first = answers[0].json()
    assert len(first["actions"]) == 5 and len(first["value"]) == 5
    for other in answers[1:]:
        assert other.json() == first


async def test_a_float64_block_is_cast_like_json_numbers(make_client):
    _, client = make_client(("mlp",))
    lists, b64, raw = await _three_forms(client, ROWS.astype(np.float64), [])
    assert b64.json()["actions"] == lists.json()["actions"] == raw.json()["actions"]
    np.testing.assert_allclose(b64.json()["logp"], lists.json()["logp"], rtol=0, atol=0)


async def test_block_rows_work_with_the_other_batch_fields(make_client):
    """The JSON block is the batch form: per-row fields such as sessions go along."""
    _, client = make_client(("lstm",))
    arr = ROWS[:2]
    r = await client.post("/v1/models/lstm/act", json={
        "observations": block(arr), "session_ids": ["a", "b"], "episode_starts": [True, True]})
    assert r.status_code == 200, r.text
    assert r.json()["session_ids"] == ["a", "b"]


@pytest.mark.parametrize("row, index, value", [(3, 2, np.nan), (0, 0, np.inf), (4, 3, -np.inf)])
async def test_a_non_finite_value_is_refused_naming_its_row(make_client, row, index, value):
    _, client = make_client(("mlp",))
    bad = ROWS.copy()
    bad[row, index] = value
    for r in [await client.post("/v1/models/mlp/act", json={"observations": block(bad)}),
              await client.post("/v1/models/mlp/act", content=bad.tobytes(), headers=raw_headers(bad))]:
        assert r.status_code == 422
        err = error_of(r)
        assert err["field"] == "observations" and f"row {row} index [{index}]" in err["message"], err
        assert err["expected"]["type"] == "Box" and "shape [5, 4]" in err["received"]


async def test_float64_values_beyond_float32_are_refused_naming_the_row(make_client):
    _, client = make_client(("mlp",))
    bad = ROWS.astype(np.float64)
    bad[2, 1] = 1e39  # finite as float64, inf as the model's float32
    r = await client.post("/v1/models/mlp/act", json={"observations": block(bad)})
    assert r.status_code == 422 and "row 2 index [1]" in error_of(r)["message"]


@pytest.mark.parametrize("override, field, expected", [
    ({"shape": [5, 3]}, "observations.b64", "60 bytes"),
    ({"shape": [5, 2, 2]}, "observations", "[B, 4]"),
    ({"dtype": "complex64"}, "observations.dtype", "one of"),
    ({"shape": [0, 4]}, "observations.shape", "B >= 1"),
    ({"b64": "not base64!"}, "observations.b64", "base64"),
])
async def test_a_block_that_does_not_fit_is_refused_naming_the_field(make_client, override, field, expected):
    _, client = make_client(("mlp",))
    r = await client.post("/v1/models/mlp/act", json={"observations": block(ROWS, **override)})
    err = error_of(r)
    assert r.status_code == 422 and err["field"] == field, err
    assert expected in str(err["expected"]) + err["message"], err


async def test_an_int_block_for_an_integer_space_is_range_checked(make_client):
    """A uint8 image block: values are checked against the dtype, naming the row."""
    _, client = make_client(("image",))
    imgs = np.random.default_rng(0).integers(0, 256, (2, 10, 10, 3)).astype(np.uint8)
    ok = await client.post("/v1/models/image/act", content=imgs.tobytes(), headers=raw_headers(imgs))
    assert ok.status_code == 200 and len(ok.json()["actions"]) == 2
    wide = imgs.astype(np.int16)
    wide[1, 4, 4, 2] = 300
    r = await client.post("/v1/models/image/act", content=wide.tobytes(), headers=raw_headers(wide))
    assert r.status_code == 422 and "row 1 index [4, 4, 2]" in error_of(r)["message"]


@pytest.mark.parametrize("headers, field", [
    ({"x-rlserve-dtype": None}, "X-Rlserve-Dtype"),
    ({"x-rlserve-shape": None}, "X-Rlserve-Shape"),
    ({"x-rlserve-shape": "five,4"}, "X-Rlserve-Shape"),
    ({"x-rlserve-shape": "[5, 4]"}, "X-Rlserve-Shape"),
    ({"x-rlserve-shape": "6,4"}, "body"),
    ({"x-rlserve-explore": "maybe"}, "X-Rlserve-Explore"),
    ({"x-rlserve-outputs": "value,advantages"}, "X-Rlserve-Outputs"),
])
async def test_raw_bodies_with_bad_headers_are_refused_naming_the_header(make_client, headers, field):
    _, client = make_client(("mlp",))
    sent = {k: v for k, v in {**raw_headers(ROWS), **headers}.items() if v is not None}
    r = await client.post("/v1/models/mlp/act", content=ROWS.tobytes(), headers=sent)
    assert r.status_code == 422 and error_of(r)["field"] == field, r.text


async def test_rlserve_headers_on_a_json_request_are_checked_too(make_client):
    _, client = make_client(("mlp",))
    good = await client.post("/v1/models/mlp/act", json={"observation": ROWS[0].tolist()},
                             headers={"x-rlserve-explore": "false"})
    bad = await client.post("/v1/models/mlp/act", json={"observation": ROWS[0].tolist()},
                            headers={"x-rlserve-dtype": "float128"})
    assert good.status_code == 200
    assert bad.status_code == 422 and error_of(bad)["field"] == "X-Rlserve-Dtype"


async def test_a_block_needs_a_box_observation_space(make_client):
    _, client = make_client(("masked",))
    arr = np.zeros((2, 8), np.float32)
    r = await client.post("/v1/models/masked/act", content=arr.tobytes(), headers=raw_headers(arr))
    assert r.status_code == 422 and "Box" in error_of(r)["message"]


async def test_the_block_is_read_with_one_frombuffer(monkeypatch):
    """No per-row decoding: the whole block is one numpy.frombuffer call."""
    calls = []
    real = np.frombuffer

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(binary.np, "frombuffer", counting)
    arr = np.zeros((64, 16), np.float32)
    rows, _ = binary.raw_rows([(b"x-rlserve-dtype", b"float32"), (b"x-rlserve-shape", b"64,16")], arr.tobytes(),
                              Expect(64, ((16,),)))
    assert len(calls) == 1 and rows.observations.shape == (64, 16) and len(rows) == 64
