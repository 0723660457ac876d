"""Unit tests of the small blocks the numpy action distributions compute in Python floats
(a served single-observation batch): the same bits as the numpy path, alone or in a batch,
in the (B, n) layout or on its transpose.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch  # the reference implementation (the test extra installs it)
from gymnasium import spaces as gs

from rlserve.models.distributions import DistributionError, get_action_dist

from .distribution_helpers import _close

# ------------------------------------------------------- small blocks in Python floats

_MASKED = -3.4028235e38


def _small_blocks() -> list[np.ndarray]:
    """Blocks small enough for the Python path: random, masked, -inf, exact ties, logits far
    from zero, one row of two logits and one of 32."""
    rng = np.random.default_rng(7)
    return [
        rng.normal(0.0, 2.0, size=(1, 4)),
        rng.normal(0.0, 2.0, size=(8, 4)),
        rng.normal(0.0, 5.0, size=(2, 16)),
        rng.normal(0.0, 1.0, size=(1, 32)),
        np.array([[0.1, _MASKED, 0.2, _MASKED], [_MASKED, _MASKED, 1.0, _MASKED]]),
        np.array([[-np.inf, 0.5, 0.25, -np.inf]]),
        np.array([[1.5, 1.5, -2.0, 1.5], [0.0, 0.0, 0.0, 0.0]]),  # the first of tied maxima
        np.array([[1e20, 1e20 - 1e14, -1e20, 0.0]]),
        np.array([[3.0, -30.0]]),
    ]


@pytest.mark.parametrize("block", _small_blocks(), ids=lambda b: f"{b.shape[0]}x{b.shape[1]}")
def test_small_blocks_in_python_floats_give_the_numpy_paths_bits(block, monkeypatch):
    """A block of at most ``_PY_BLOCK`` logits is normalised and sampled with Python floats
    (the served single-observation batch), a larger one with numpy: the same float64
    operations in the same order, so a row's logp, probabilities, mode and draws do not
    depend on the batch it shares. (Exact here; where numpy has SIMD float64 exp/log of its
    own, a last-bit difference survives rounding to float32 about once in 10^9 values.)"""
    from rlserve.models.distributions import categorical

    x = block.astype(np.float32)
    assert x.size <= categorical._PY_BLOCK
    spec = get_action_dist(gs.Discrete(x.shape[1]))
    small = spec.build(x)
    assert small._cat._rows is not None  # the Python path was taken
    monkeypatch.setattr(categorical, "_PY_BLOCK", -1)
    ref = spec.build(x)
    assert ref._cat._rows is None

    np.testing.assert_array_equal(small.logp_each_action(), ref.logp_each_action())
    np.testing.assert_array_equal(small.probs, ref.probs)
    np.testing.assert_array_equal(small.entropy(), ref.entropy())
    np.testing.assert_array_equal(small.deterministic_sample(), ref.deterministic_sample())
    np.testing.assert_array_equal(small.logp_of_sample(), ref.logp_of_sample())
    ours = [small.sample(g) for g in [np.random.default_rng(11)] for _ in range(2000)]
    theirs = [ref.sample(g) for g in [np.random.default_rng(11)] for _ in range(2000)]
    np.testing.assert_array_equal(ours, theirs)
    assert np.all(ref.probs[np.arange(x.shape[0]), ours[0]] > 0)  # never a masked index
    np.testing.assert_array_equal(small.logp(ours[0]), ref.logp(ours[0]))
    # Both agree with torch's float32 Categorical to float32 rounding.
    finite = np.isfinite(x).all(axis=1) & (np.abs(x) < 1e19).all(axis=1)
    if finite.any():
        want = torch.distributions.Categorical(logits=torch.from_numpy(x[finite])).logits.numpy()
        _close(small.logp_each_action()[finite], want, rtol=1e-6, atol=1e-6)


def test_a_row_gets_the_same_bits_alone_and_in_a_batch():
    rows = np.random.default_rng(5).normal(0.0, 3.0, size=(64, 6)).astype(np.float32)
    rows[::7, 2] = _MASKED
    spec = get_action_dist(gs.Discrete(6))
    batch = spec.build(rows)
    assert batch._cat._rows is None
    alone = [spec.build(rows[i:i + 1]) for i in range(len(rows))]
    assert all(d._cat._rows is not None for d in alone)
    np.testing.assert_array_equal(np.concatenate([d.logp_each_action() for d in alone]), batch.logp_each_action())
    np.testing.assert_array_equal(np.concatenate([d.probs for d in alone]), batch.probs)
    np.testing.assert_array_equal(np.concatenate([d.deterministic_sample() for d in alone]),
                                  batch.deterministic_sample())


@pytest.mark.parametrize("rows,width", [(64, 4), (9, 4), (40, 40), (300, 7)])
def test_a_tall_block_on_its_transpose_gives_the_row_layouts_bits(rows, width, monkeypatch):
    """The numpy path of a block with at least as many rows as categories (a served batch)
    works on its transpose; a block narrower in rows than in categories keeps the (B, n)
    layout. The same rows must get the same bits either way, draws included (the uniforms
    are the same stream whether drawn for the whole block or a few rows at a time)."""
    from rlserve.models.distributions import categorical

    monkeypatch.setattr(categorical, "_PY_BLOCK", -1)  # numpy in both layouts
    x = np.random.default_rng(rows).normal(0.0, 4.0, size=(rows, width)).astype(np.float32)
    x[::5, 1] = _MASKED
    x[::3, 2] = x[::3, 0]  # ties
    spec = get_action_dist(gs.Discrete(width))
    tall = spec.build(x)
    assert tall._cat._probs_t is not None  # the transposed path
    step = max(1, width - 1)  # fewer rows than categories: the (B, n) layout
    parts = [spec.build(x[i:i + step]) for i in range(0, rows, step)]
    assert all(p._cat._probs_t is None for p in parts)

    def joined(get):
        return np.concatenate([get(p) for p in parts])

    np.testing.assert_array_equal(tall.logp_each_action(), joined(lambda p: p.logp_each_action()))
    np.testing.assert_array_equal(tall.probs, joined(lambda p: p.probs))
    np.testing.assert_array_equal(tall.entropy(), joined(lambda p: p.entropy()))
    np.testing.assert_array_equal(tall.deterministic_sample(), joined(lambda p: p.deterministic_sample()))
    for seed in range(20):
        g_tall, g_parts = np.random.default_rng(seed), np.random.default_rng(seed)
        drawn = tall.sample(g_tall)
        np.testing.assert_array_equal(drawn, joined(lambda p, g=g_parts: p.sample(g)))
        assert np.all(tall.probs[np.arange(rows), drawn] > 0)  # never a masked index
        np.testing.assert_array_equal(tall.logp_of_sample(), tall.logp(drawn))
        np.testing.assert_array_equal(tall.logp(drawn),
                                      np.concatenate([p.logp(d) for p, d in
                                                      zip(parts, np.split(drawn, range(step, rows, step)),
                                                          strict=True)]))


def test_small_blocks_refuse_nan_and_leave_huge_logits_to_numpy():
    from rlserve.models.distributions import categorical

    spec = get_action_dist(gs.Discrete(3))
    for row in ([0.0, np.nan, 1.0], [np.nan, 0.0, 1.0]):  # max() skips a NaN that is not first
        with pytest.raises(DistributionError, match=r"NaN in rows \[1\]"):
            spec.build(np.array([[0.0, 1.0, 2.0], row], np.float32))
    with np.errstate(invalid="ignore"):
        huge = spec.build(np.array([[np.inf, 0.0, 1.0]], np.float32))
    assert huge._cat._rows is None
    assert categorical._PY_BLOCK >= 20  # a categorical over 2-20 logits stays off numpy at B = 1


def test_small_multicategorical_blocks_sample_like_the_numpy_path(monkeypatch):
    from rlserve.models.distributions import categorical

    x = np.random.default_rng(3).normal(size=(2, 5)).astype(np.float32)
    spec = get_action_dist(gs.MultiDiscrete([3, 2]))
    small = spec.build(x)
    assert all(cat._rows is not None for cat in small.cats)
    ours = [small.sample(np.random.default_rng(seed)) for seed in range(50)]
    monkeypatch.setattr(categorical, "_PY_BLOCK", -1)
    ref = spec.build(x)
    np.testing.assert_array_equal(ours, [ref.sample(np.random.default_rng(seed)) for seed in range(50)])
    _close(small.logp(ours[0]), ref.logp(ours[0]), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(small.deterministic_sample(), ref.deterministic_sample())


@pytest.mark.parametrize("shape,batch", [((1,), 1), ((2,), 1), ((6,), 2), ((4,), 16)])
def test_diag_gaussian_logp_of_its_sample_agrees_with_logp(shape, batch, monkeypatch):
    """The served logp of a DiagGaussian's own sample skips the action checks, and small
    blocks take Python floats: the same numbers as ``logp`` to float32 rounding."""
    from rlserve.models.distributions import gaussian

    width = int(np.prod(shape))
    inputs = np.random.default_rng(9).normal(0.0, 1.5, size=(batch, 2 * width)).astype(np.float32)
    inputs[0, width] = -30.0  # a tiny std
    dist = get_action_dist(gs.Box(-1, 1, shape)).build(inputs)
    calls = []
    real = gaussian._py_normal_logp
    monkeypatch.setattr(gaussian, "_py_normal_logp", lambda *a: calls.append(1) or real(*a))
    for draw_from in (lambda: dist.sample(np.random.default_rng(4)), dist.deterministic_sample):
        draw = draw_from()
        _close(dist.logp_of_sample(), dist.logp(draw), rtol=1e-6, atol=1e-5)
    assert len(calls) == (2 if batch * width <= gaussian._PY_BLOCK else 0)


def test_a_diag_gaussian_row_gets_the_same_logp_bits_alone_and_in_a_batch():
    inputs = np.random.default_rng(12).normal(0.0, 1.0, size=(40, 6)).astype(np.float32)
    spec = get_action_dist(gs.Box(-1, 1, (3,)))
    batch = spec.build(inputs)
    drawn = batch.sample(np.random.default_rng(2))
    served = batch.logp_of_sample()
    for i in range(len(inputs)):
        alone = spec.build(inputs[i:i + 1])
        alone.last_sample = drawn[i:i + 1]
        np.testing.assert_array_equal(alone.logp_of_sample(), served[i:i + 1])
    _close(served, batch.logp(drawn), rtol=1e-6, atol=1e-5)


def test_diag_gaussian_logp_of_its_sample_outside_the_python_path():
    """A std that underflows to 0 or overflows to inf gives what ``logp`` gives (numpy's
    errstate path), never a Python exception; a NaN mean is refused as ``logp`` refuses it."""
    spec = get_action_dist(gs.Box(-1, 1, (2,)))
    with np.errstate(all="ignore"):
        for row in ([0.5, -1.0, -200.0, 0.0], [0.5, -1.0, 100.0, 0.0]):
            dist = spec.build(np.array([row], np.float32))
            draw = dist.deterministic_sample()
            np.testing.assert_array_equal(dist.logp_of_sample(), dist.logp(draw))
        dist = spec.build(np.array([[np.nan, 0.0, 0.0, 0.0]], np.float32))
        dist.deterministic_sample()
        with pytest.raises(DistributionError, match="NaN"):
            dist.logp_of_sample()


# ------------------------------------------------------- seeded rows of a served batch

@pytest.mark.parametrize("rows,n,temperature", [(1, 2, 1.0), (12, 2, 1.0), (64, 2, 1.0), (40, 7, 0.7),
                                                 (3, 40, 1.0)])
def test_sample_rows_draws_each_row_as_its_own_one_row_distribution(rows, n, temperature):
    """A seeded session's row of a served batch (``BatchStep._act_mixed``) is drawn by
    ``Categorical.sample_rows`` at once: each row the action, and its generator the state,
    that a one-row Categorical of that row leaves, whether the batch took the Python path or
    numpy's, with masked logits and a temperature."""
    data = np.random.default_rng(rows * n)
    x = data.normal(0.0, 3.0, size=(rows, n)).astype(np.float32)
    x[data.random((rows, n)) < 0.2] = _MASKED
    x[:, 0] = data.normal(size=rows)  # every row keeps a category with mass
    spec = get_action_dist(gs.Discrete(n), None, dist_type="TorchCategorical",
                           dist_kwargs={"temperature": temperature})
    batch = spec.build(x)
    assert (batch._cat._rows is None) == (x.size > 32)  # both paths are covered
    chosen = [int(r) for r in data.choice(rows, size=max(1, rows // 2), replace=False)]
    seeds = [int(s) for s in data.integers(0, 2**31, size=len(chosen))]
    drawn = batch.sample_rows(chosen, [np.random.default_rng(s) for s in seeds])
    for row, seed, action in zip(chosen, seeds, drawn, strict=True):
        own_rng, rows_rng = np.random.default_rng(seed), np.random.default_rng(seed)
        rows_rng.random()  # what sample_rows drew from it
        assert spec.build(x[row:row + 1]).sample(own_rng)[0] == action
        assert own_rng.random() == rows_rng.random()  # the generators are left alike


def test_sample_rows_leaves_rows_past_the_short_path_to_the_caller():
    """A row with NaN or huge logits has no Python-float draw: None, and the batch step builds
    that row's own distribution (which refuses or handles it)."""
    spec = get_action_dist(gs.Discrete(3))
    x = np.array([[0.1, 0.2, 0.3]] * 20 + [[1e31, 0.0, 0.0]], dtype=np.float32)
    assert spec.build(x).sample_rows([0, 20], [np.random.default_rng(0), np.random.default_rng(1)]) is None
    assert spec.build(x).sample_rows([0, 1], [np.random.default_rng(0), np.random.default_rng(1)]) is not None
