"""Action masking: RLlib's ``logits + max(log(mask), -3.4e38)`` on every categorical part."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces as gs

from rlserve.models.distributions import get_action_dist
from rlserve.models.distributions.masking import FLOAT_MIN, MaskError, apply_action_mask

DRAWS = 10_000


def _random_mask(rng: np.random.Generator, batch: int, n: int) -> np.ndarray:
    mask = (rng.random((batch, n)) < 0.5).astype(np.float32)
    mask[np.arange(batch), rng.integers(0, n, batch)] = 1.0  # every row allows something
    return mask


def test_discrete_mask_is_never_sampled():
    rng = np.random.default_rng(0)
    spec = get_action_dist(gs.Discrete(6))
    logits = rng.normal(0, 3, (8, 6)).astype(np.float32)
    mask = _random_mask(rng, 8, 6)
    masked = apply_action_mask(logits, mask, spec)
    np.testing.assert_array_equal(masked[mask == 0], np.float32(-3.4e38))
    np.testing.assert_array_equal(masked[mask == 1], logits[mask == 1])
    rows = np.repeat(np.arange(8), DRAWS // 8)
    dist = spec.build(masked[rows])
    draws = dist.sample(np.random.default_rng(1))
    assert np.all(mask[rows, draws] == 1)
    assert np.all(np.isfinite(dist.entropy()))
    # A masked action has (finite) logp about -3.4e38.
    assert np.all(dist.logp_each_action()[mask[rows] == 0] < -1e38)


def test_bool_mask_and_all_allowed_rows():
    spec = get_action_dist(gs.Discrete(3))
    logits = np.zeros((2, 3), np.float32)
    out = apply_action_mask(logits, np.array([[True, False, True], [True, True, True]]), spec)
    np.testing.assert_array_equal(out, [[0, FLOAT_MIN, 0], [0, 0, 0]])
    assert out is not logits and np.all(logits == 0)


def test_multidiscrete_flat_and_per_component_masks():
    rng = np.random.default_rng(2)
    spec = get_action_dist(gs.MultiDiscrete([3, 4]))
    logits = rng.normal(0, 2, (5, 7)).astype(np.float32)
    m0, m1 = _random_mask(rng, 5, 3), _random_mask(rng, 5, 4)
    flat = apply_action_mask(logits, np.concatenate([m0, m1], axis=1), spec)
    np.testing.assert_array_equal(flat, apply_action_mask(logits, [m0, m1], spec))
    rows = np.repeat(np.arange(5), DRAWS // 5)
    draws = spec.build(flat[rows]).sample(np.random.default_rng(3))
    assert np.all(m0[rows, draws[:, 0]] == 1) and np.all(m1[rows, draws[:, 1]] == 1)


def test_tuple_components_structured_and_flat():
    rng = np.random.default_rng(4)
    space = gs.Tuple([gs.Discrete(3), gs.Box(-1, 1, (2,)), gs.MultiDiscrete([2, 3])])
    spec = get_action_dist(space)  # inputs: 3 | 4 | 5
    logits = rng.normal(0, 2, (6, spec.num_outputs)).astype(np.float32)
    m_a, m_b0, m_b1 = _random_mask(rng, 6, 3), _random_mask(rng, 6, 2), _random_mask(rng, 6, 3)
    structured = apply_action_mask(logits, (m_a, None, [m_b0, m_b1]), spec)
    flat = apply_action_mask(logits, np.concatenate([m_a, m_b0, m_b1], axis=1), spec)
    np.testing.assert_array_equal(structured, flat)
    np.testing.assert_array_equal(structured[:, 3:7], logits[:, 3:7])  # the Box part is untouched
    rows = np.repeat(np.arange(6), DRAWS // 6)
    a, _, b = spec.build(structured[rows]).sample(np.random.default_rng(5))
    assert np.all(m_a[rows, a] == 1)
    assert np.all(m_b0[rows, b[:, 0]] == 1) and np.all(m_b1[rows, b[:, 1]] == 1)


def test_dict_mask_may_leave_out_other_leaves():
    space = gs.Dict({"move": gs.Discrete(4), "aim": gs.Box(-1, 1, (1,)), "fire": gs.Discrete(2)})
    spec = get_action_dist(space)  # sorted: aim(2) | fire(2) | move(4)
    logits = np.zeros((1, 8), np.float32)
    out = apply_action_mask(logits, {"move": np.array([[1, 0, 0, 1]])}, spec)
    np.testing.assert_array_equal(out[0, :4], 0)
    np.testing.assert_array_equal(out[0, 4:], [0, FLOAT_MIN, FLOAT_MIN, 0])


def test_all_masked_row_names_row_and_component():
    spec = get_action_dist(gs.Discrete(3))
    with pytest.raises(MaskError, match=r"rows \[1\]"):
        apply_action_mask(np.zeros((2, 3), np.float32), np.array([[1, 0, 0], [0, 0, 0]]), spec)
    md = get_action_dist(gs.MultiDiscrete([2, 2]))
    with pytest.raises(MaskError, match=r"component 1 allows no action in rows \[0\]"):
        apply_action_mask(np.zeros((1, 4), np.float32), np.array([[1, 0, 0, 0]]), md)
    tup = get_action_dist(gs.Tuple([gs.Discrete(2), gs.Discrete(2)]))
    with pytest.raises(MaskError, match=r"leaf '1'.*rows \[0\]"):
        apply_action_mask(np.zeros((1, 4), np.float32), (np.array([[1, 1]]), np.array([[0, 0]])), tup)
    assert issubclass(MaskError, ValueError)


def test_shape_and_value_errors():
    spec = get_action_dist(gs.Discrete(3))
    with pytest.raises(ValueError, match=r"expected shape \(2, 3\), got \(2, 4\)"):
        apply_action_mask(np.zeros((2, 3), np.float32), np.ones((2, 4)), spec)
    with pytest.raises(ValueError, match=r"dist inputs: expected shape \(B, 3\)"):
        apply_action_mask(np.zeros((2, 5), np.float32), np.ones((2, 3)), spec)
    with pytest.raises(ValueError, match=">= 0"):
        apply_action_mask(np.zeros((1, 3), np.float32), np.array([[1, -1, 1]]), spec)
    tup = get_action_dist(gs.Tuple([gs.Discrete(2), gs.Box(-1, 1, (1,))]))
    with pytest.raises(ValueError, match="non-categorical"):
        apply_action_mask(np.zeros((1, 4), np.float32), (np.ones((1, 2)), np.ones((1, 2))), tup)
    with pytest.raises(ValueError, match="categorical"):
        apply_action_mask(np.zeros((1, 4), np.float32), np.ones((1, 4)), get_action_dist(gs.Box(-1, 1, (2,))))
