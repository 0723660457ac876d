"""MeanStdFilter / NoFilter: statistics, batched update, frozen apply, state round trips."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlserve.models.filters import MeanStdFilter, NoFilter, filter_from_state, make_filter

_rows = hnp.arrays(np.float32, st.tuples(st.integers(1, 12), st.just(3)),
                   elements=st.floats(-1e3, 1e3, width=32))


@settings(max_examples=100, deadline=None)
@given(_rows)
def test_statistics_match_numpy(rows: np.ndarray) -> None:
    filt = MeanStdFilter((3,))
    for row in rows:
        filt.push(row)
    x = rows.astype(np.float64)
    np.testing.assert_allclose(filt.mean, x.mean(axis=0), rtol=1e-9, atol=1e-9)
    expected_var = x.var(axis=0, ddof=1) if len(rows) > 1 else np.zeros(3)
    np.testing.assert_allclose(filt.var, expected_var, rtol=1e-4, atol=1e-3)
    assert filt.var.dtype == filt.std.dtype == np.float32


@settings(max_examples=100, deadline=None)
@given(_rows)
def test_batched_update_equals_sequential_pushes(rows: np.ndarray) -> None:
    one_by_one = MeanStdFilter((3,))
    for row in rows:
        one_by_one(row, update=True)
    batched = MeanStdFilter((3,))
    out = batched(rows, update=True)
    assert batched.num_pushes == one_by_one.num_pushes == len(rows)
    np.testing.assert_array_equal(batched.mean_array, one_by_one.mean_array)
    np.testing.assert_array_equal(batched.sum_sq_diff_array, one_by_one.sum_sq_diff_array)
    # The whole batch is then normalised with the final statistics.
    np.testing.assert_array_equal(out, one_by_one(rows, update=False))


def test_frozen_batch_equals_rows_and_does_not_update() -> None:
    filt = MeanStdFilter((2,))
    for row in np.random.default_rng(0).normal(3.0, 2.0, (20, 2)):
        filt(row)
    batch = np.random.default_rng(1).normal(0.0, 5.0, (7, 2)).astype(np.float32)
    before = filt.state_dict()
    out = filt(batch, update=False)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.stack([filt(r, update=False) for r in batch]))
    assert filt.state_dict() == before


def test_normalisation_formula_and_clip() -> None:
    filt = MeanStdFilter((1,))
    for v in (1.0, 3.0):
        filt.push(np.array([v]))
    # mean 2, unbiased var 2 -> std sqrt(2)
    out = filt(np.array([2.0 + np.sqrt(2.0)]), update=False)
    np.testing.assert_allclose(out, [1.0], rtol=1e-5)
    assert filt(np.array([1e6]), update=False)[0] == 10.0
    assert filt(np.array([-1e6]), update=False)[0] == -10.0


def test_fresh_and_one_push_filters_have_zero_std() -> None:
    filt = MeanStdFilter((2,))
    np.testing.assert_array_equal(filt.std, 0.0)
    filt.push(np.array([1.0, -1.0]))
    np.testing.assert_array_equal(filt.std, 0.0)
    np.testing.assert_array_equal(filt(np.array([2.0, -1.0]), update=False), [10.0, 0.0])


def test_input_shape_is_checked() -> None:
    filt = MeanStdFilter((3,))
    with pytest.raises(ValueError, match=r"expected an observation of shape \(3,\)"):
        filt(np.zeros(4))
    with pytest.raises(ValueError, match="expected shape"):
        filt.push(np.zeros((2, 3)))


def _trained(n: int = 10) -> MeanStdFilter:
    filt = MeanStdFilter((2, 2), clip=5.0)
    for row in np.random.default_rng(n).normal(size=(n, 2, 2)):
        filt(row)
    return filt


def test_state_dict_json_round_trip_is_exact() -> None:
    filt = _trained()
    state = json.loads(json.dumps(filt.state_dict()))
    restored = filter_from_state(state)
    assert isinstance(restored, MeanStdFilter)
    assert restored.num_pushes == filt.num_pushes and restored.clip == 5.0 and restored.shape == (2, 2)
    np.testing.assert_array_equal(restored.mean_array, filt.mean_array)
    np.testing.assert_array_equal(restored.sum_sq_diff_array, filt.sum_sq_diff_array)
    x = np.random.default_rng(5).normal(size=(3, 2, 2))
    np.testing.assert_array_equal(restored(x, update=False), filt(x, update=False))


def test_arrays_round_trip_through_npz() -> None:
    filt = _trained()
    buffer = io.BytesIO()
    np.savez(buffer, **filt.to_arrays())
    buffer.seek(0)
    with np.load(buffer) as data:
        restored = MeanStdFilter.from_arrays({k: data[k] for k in data.files})
    assert restored.state_dict() == filt.state_dict()
    no_clip = MeanStdFilter((1,), clip=None)
    assert MeanStdFilter.from_arrays(no_clip.to_arrays()).clip is None


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"type": "MeanStdFilter", "shape": [2], "num_pushes": 1, "mean": [0.0]}, "missing key 'sum_sq_diff'"),
        ({"type": "MeanStdFilter", "shape": [2], "num_pushes": 1, "mean": [0.0], "sum_sq_diff": [0.0, 0.0]},
         "'mean': expected shape"),
        ({"type": "MeanStdFilter", "shape": [1], "num_pushes": -1, "mean": [0.0], "sum_sq_diff": [0.0]},
         "num_pushes"),
        ({"type": "Teapot"}, "'type'"),
    ],
)
def test_bad_state_is_rejected(state, message) -> None:
    with pytest.raises(ValueError, match=message):
        filter_from_state(state)


def test_no_filter_is_identity() -> None:
    filt = make_filter("NoFilter", (3,))
    x = np.arange(3.0)
    np.testing.assert_array_equal(filt(x), x)
    assert isinstance(filter_from_state(json.loads(json.dumps(filt.state_dict()))), NoFilter)
    assert isinstance(make_filter("MeanStdFilter", (3,)), MeanStdFilter)
    with pytest.raises(ValueError, match="observation_filter"):
        make_filter("Median", (3,))
