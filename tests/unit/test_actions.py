"""Action batches: RLlib's flat row layout, clip/unsquash, and env-space JSON values."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gymnasium import spaces as gs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlserve.models.distributions.actions import (
    action_width,
    actions_from_json,
    actions_to_json,
    clip_actions,
    flatten_actions,
    unflatten_actions,
    unsquash_actions,
)
from rlserve.models.spaces import Repeated

from .space_catalog import spaces as any_space


def _close(actual, expected, rtol=1e-6, atol=1e-6):
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64), rtol=rtol, atol=atol)


def _has_repeated(space) -> bool:
    if isinstance(space, Repeated):
        return True
    children = getattr(space, "spaces", None)
    if isinstance(children, dict):
        children = list(children.values())
    return any(_has_repeated(s) for s in (children or []))


def _model_space_batch(space, batch: int):
    """Independent sampler: env samples turned into model space (indices for discrete)."""
    if isinstance(space, gs.Tuple):
        return tuple(_model_space_batch(s, batch) for s in space.spaces)
    if isinstance(space, gs.Dict):
        return {k: _model_space_batch(s, batch) for k, s in space.spaces.items()}
    rows = np.stack([np.asarray(space.sample()) for _ in range(batch)])
    if isinstance(space, gs.Discrete | gs.MultiDiscrete):
        return (rows - space.start).astype(np.int64)
    if isinstance(space, gs.Box) and np.dtype(space.dtype).name.startswith("int"):
        return (rows - np.min(space.low)).astype(space.dtype)
    return rows


def _assert_same(a, b):
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for u, v in zip(a, b, strict=True):
            _assert_same(u, v)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _assert_same(a[k], b[k])
    else:
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=1e-6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(space=any_space.filter(lambda s: not _has_repeated(s)), batch=st.integers(1, 4))
def test_flatten_unflatten_and_json_round_trip(space, batch):
    space.seed(0)
    actions = _model_space_batch(space, batch)
    flat = flatten_actions(space, actions)
    assert flat.shape == (batch, action_width(space)) and flat.dtype == np.float32
    _assert_same(unflatten_actions(space, flat), actions)
    for row in range(batch):
        value = json.loads(json.dumps(actions_to_json(space, actions, row)))
        back = actions_from_json(space, value)
        expected = _model_space_batch_row(actions, row)
        _assert_same(back, expected)


def _model_space_batch_row(actions, row):
    if isinstance(actions, tuple):
        return tuple(_model_space_batch_row(a, row) for a in actions)
    if isinstance(actions, dict):
        return {k: _model_space_batch_row(v, row) for k, v in actions.items()}
    return np.asarray(actions)[row:row + 1]


def test_flat_layout_and_json_offsets():
    space = gs.Tuple([gs.Discrete(3, start=5), gs.MultiDiscrete([2, 4], start=[1, -1]), gs.Box(-2, 2, (2,), np.int64)])
    actions = (np.array([2]), np.array([[1, 3]]), np.array([[0, 4]]))
    np.testing.assert_array_equal(flatten_actions(space, actions), [[2, 1, 3, 0, 4]])
    assert actions_to_json(space, actions, 0) == [7, [2, 2], [-2, 2]]  # + start, + start, + low
    with pytest.raises(ValueError, match=r"'0'.*not in Discrete"):
        actions_from_json(space, [4, [1, 0], [0, 0]])
    with pytest.raises(ValueError, match="expected shape"):
        actions_from_json(space, [5, [1], [0, 0]])
    with pytest.raises(ValueError, match="list of 3"):
        actions_from_json(space, [5, [1, 0]])
    box = gs.Box(-1, 1, (2,))
    assert actions_to_json(box, np.array([[np.inf, 0.5]]), 0) == ["inf", 0.5]
    with pytest.raises(ValueError, match="not in Box"):
        actions_from_json(box, [2.0, 0.0])


def test_clip_and_unsquash_follow_rllib():
    space = gs.Dict(
        {
            "a": gs.Box(np.array([0.0, -10.0], np.float32), np.array([4.0, 10.0], np.float32), dtype=np.float32),
            "b": gs.Discrete(3),
            "c": gs.Box(-np.inf, np.inf, (1,), np.float32),
            "d": gs.Box(-1, 2, (1,), np.int64),
        }
    )
    actions = {
        "a": np.array([[-1.0, 0.5], [1.0, 3.0]], np.float32),
        "b": np.array([1, 2]),
        "c": np.array([[5.0], [-7.0]], np.float32),
        "d": np.array([[3], [0]]),
    }
    out = unsquash_actions(space, actions)
    _close(out["a"], [[0.0, 5.0], [4.0, 10.0]])  # low + (a + 1)(high - low)/2, clipped
    _close(out["c"], actions["c"])  # unbounded Box: unchanged
    np.testing.assert_array_equal(out["d"], actions["d"])  # integer Box: unchanged
    clipped = clip_actions(space, actions)
    _close(clipped["a"], [[0.0, 0.5], [1.0, 3.0]])
    np.testing.assert_array_equal(clipped["b"], actions["b"])
    np.testing.assert_array_equal(clipped["d"], actions["d"])  # indices, not values
