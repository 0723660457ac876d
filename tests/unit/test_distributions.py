"""Unit tests of the numpy action distributions, the catalog rule, the registry and the
action helpers.

Reference numbers come from ``torch.distributions`` (an independent implementation; the
test extra installs torch) and from closed-form moments checked on large seeded samples.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch  # the reference implementation (the test extra installs it)
from gymnasium import spaces as gs

from rlserve.models.distributions import (
    ActionDistribution,
    ActionDistSpec,
    ActionOutOfSupportError,
    DistributionError,
    MultiActionDistribution,
    UnknownActionDistError,
    UnsupportedActionSpaceError,
    UnsupportedMethodError,
    get_action_dist,
    register_action_dist,
    unregister_action_dist,
)
from rlserve.models.distributions._math import digamma, digamma32, lgamma
from rlserve.models.distributions.actions import action_width, flatten_actions
from rlserve.models.spaces import Repeated, Simplex

td = torch.distributions

RNG = np.random.default_rng(1234)


def _inputs(batch: int, width: int) -> np.ndarray:
    """Random rows plus the rows that push RLlib's clamps (+-15 alternating, a ramp)."""
    rows = [RNG.normal(0.0, 2.0, size=(batch, width))]
    rows.append(np.where(np.arange(width) % 2 == 0, 15.0, -15.0)[None])
    rows.append(np.linspace(-15.0, 15.0, width)[None])
    return np.concatenate(rows).astype(np.float32)


def _close(actual, expected, rtol=1e-5, atol=1e-5):
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64), rtol=rtol, atol=atol)


# --------------------------------------------------------------------------- vs torch

def test_categorical_matches_torch():
    x = _inputs(16, 5)
    ref = td.Categorical(logits=torch.from_numpy(x))
    dist = get_action_dist(gs.Discrete(5)).build(x)
    actions = RNG.integers(0, 5, size=len(x))
    _close(dist.logp(actions), ref.log_prob(torch.from_numpy(actions)).numpy())
    _close(dist.entropy(), ref.entropy().numpy())
    np.testing.assert_array_equal(dist.deterministic_sample(), ref.probs.argmax(-1).numpy())
    _close(dist.logp_each_action(), ref.logits.numpy())


def test_multicategorical_matches_torch():
    x = _inputs(12, 9)
    dist = get_action_dist(gs.MultiDiscrete([3, 2, 4])).build(x)
    refs = [td.Categorical(logits=torch.from_numpy(b)) for b in np.split(x, [3, 5], axis=1)]
    actions = np.stack([RNG.integers(0, n, size=len(x)) for n in (3, 2, 4)], axis=1)
    expected = sum(r.log_prob(torch.from_numpy(actions[:, i])) for i, r in enumerate(refs))
    _close(dist.logp(actions), expected.numpy())
    _close(dist.entropy(), sum(r.entropy() for r in refs).numpy())
    assert dist.deterministic_sample().shape == (len(x), 3)


def test_diag_gaussian_matches_torch():
    x = _inputs(16, 6)
    mean, log_std = torch.from_numpy(x).chunk(2, dim=1)
    ref = td.Normal(mean, log_std.exp())
    dist = get_action_dist(gs.Box(-1, 1, (3,))).build(x)
    actions = RNG.normal(size=(len(x), 3)).astype(np.float32)
    _close(dist.logp(actions), ref.log_prob(torch.from_numpy(actions)).sum(-1).numpy())
    _close(dist.entropy(), ref.entropy().sum(-1).numpy())
    _close(dist.deterministic_sample(), mean.numpy())


def test_squashed_gaussian_follows_rllib_formula():
    x = _inputs(16, 4)
    spec = get_action_dist(gs.Box(-1, 1, (2,)), dist_type="squashed_gaussian", dist_kwargs={"low": -2.0, "high": 3.0})
    dist = spec.build(x)
    mean, log_std = torch.from_numpy(x).chunk(2, dim=1)
    normal = td.Normal(mean, log_std.clamp(-5, 2).exp())
    actions = RNG.uniform(-2.0, 3.0, size=(len(x), 2)).astype(np.float32)
    actions[0] = [-2.0, 3.0]  # the edges: clamped to +-(1 - 1e-6) before atanh
    normed = ((torch.from_numpy(actions) + 2.0) / 5.0 * 2.0 - 1.0).clamp(-1 + 1e-6, 1 - 1e-6)
    u = torch.atanh(normed)
    expected = normal.log_prob(u).clamp(-100, 100).sum(-1) - torch.log(1 - torch.tanh(u) ** 2 + 1e-6).sum(-1)
    _close(dist.logp(actions), expected.numpy(), rtol=2e-5)
    mode = ((torch.tanh(mean) + 1) / 2 * 5 - 2).clamp(-2, 3)
    _close(dist.deterministic_sample(), mode.numpy())
    with pytest.raises(UnsupportedMethodError):
        dist.entropy()


def test_beta_matches_torch():
    x = _inputs(16, 4)
    dist = get_action_dist(gs.Box(0, 1, (2,)), dist_type="TorchBeta").build(x)
    params = torch.log(torch.exp(torch.from_numpy(x).clamp(math.log(1e-6), -math.log(1e-6))) + 1) + 1
    alpha, beta = params.chunk(2, dim=-1)
    ref = td.Beta(alpha, beta)
    actions = RNG.uniform(0.01, 0.99, size=(len(x), 2)).astype(np.float32)
    _close(dist.logp(actions), ref.log_prob(torch.from_numpy(actions)).sum(-1).numpy())
    _close(dist.entropy(), ref.entropy().numpy())
    assert dist.entropy().shape == (len(x), 2)  # per dimension, as RLlib
    _close(dist.deterministic_sample(), ref.mean.numpy())


def test_dirichlet_matches_torch():
    x = _inputs(16, 4)
    dist = get_action_dist(Simplex((4,))).build(x)
    conc = torch.exp(torch.from_numpy(x)) + 1e-7
    ref = td.Dirichlet(conc)
    actions = RNG.dirichlet(np.ones(4), size=len(x)).astype(np.float32)
    clamped = torch.from_numpy(actions).clamp(min=1e-7)
    clamped = clamped / clamped.sum(-1, keepdim=True)
    _close(dist.logp(actions), ref.log_prob(clamped).numpy())
    _close(dist.entropy(), ref.entropy().numpy())
    _close(dist.deterministic_sample(), torch.softmax(conc, dim=-1).numpy())


def test_special_functions():
    x = np.concatenate([np.geomspace(1e-7, 1e7, 300), [0.5, 1.0, 1.4616321, 2.0, 10.0]])
    _close(lgamma(x), [math.lgamma(v) for v in x], rtol=1e-12, atol=1e-12)
    # psi is the derivative of lgamma: central differences in float64.
    h = x * 1e-5
    numeric = (np.array([math.lgamma(v + d) - math.lgamma(v - d) for v, d in zip(x, h, strict=True)])) / (2 * h)
    _close(digamma(x), numeric, rtol=1e-6, atol=1e-6)
    _close(digamma32(x), digamma(x), rtol=1e-6, atol=1e-6)
    _close(digamma(np.array([-0.5])), [0.03648997397857652], rtol=1e-12)


# --------------------------------------------------------------------------- sampling

N_DRAWS = 20000


def _draws(spec: ActionDistSpec, row: np.ndarray, n: int = N_DRAWS, seed: int = 0):
    """n draws from one row of dist inputs (the row is tiled into a batch)."""
    return spec.build(np.tile(row[None].astype(np.float32), (n, 1))).sample(np.random.default_rng(seed))


def _ks_statistic(samples: np.ndarray, cdf) -> float:
    xs = np.sort(samples)
    f = cdf(xs)
    n = len(xs)
    return float(max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(n) / n)))


def _normal_cdf(x, mean, std):
    return 0.5 * (1.0 + np.vectorize(math.erf)((x - mean) / (std * math.sqrt(2.0))))


KS_LIMIT = 1.95 / math.sqrt(N_DRAWS)  # 0.1% level


def test_categorical_frequencies():
    logits = np.array([0.3, -1.0, 2.0, 0.0, -3.0], np.float32)
    spec = get_action_dist(gs.Discrete(5))
    draws = _draws(spec, logits)
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    freq = np.bincount(draws, minlength=5) / N_DRAWS
    sigma = np.sqrt(probs * (1 - probs) / N_DRAWS)
    assert np.all(np.abs(freq - probs) < 5 * sigma), (freq, probs)
    chi2 = float(np.sum((freq - probs) ** 2 / probs) * N_DRAWS)
    assert chi2 < 18.5  # chi-square, 4 dof, 0.1% level


def test_multicategorical_component_frequencies():
    row = np.array([0.0, 1.0, -1.0, 2.0, 0.5], np.float32)
    spec = get_action_dist(gs.MultiDiscrete([3, 2]))
    draws = _draws(spec, row)
    for comp, block in ((0, row[:3]), (1, row[3:])):
        probs = np.exp(block) / np.exp(block).sum()
        freq = np.bincount(draws[:, comp], minlength=len(block)) / N_DRAWS
        assert np.all(np.abs(freq - probs) < 5 * np.sqrt(probs * (1 - probs) / N_DRAWS))


def test_diag_gaussian_samples_follow_the_normal():
    spec = get_action_dist(gs.Box(-1, 1, (2,)))
    draws = _draws(spec, np.array([0.5, -2.0, math.log(0.3), math.log(2.0)]))
    assert _ks_statistic(draws[:, 0], lambda x: _normal_cdf(x, 0.5, 0.3)) < KS_LIMIT
    assert _ks_statistic(draws[:, 1], lambda x: _normal_cdf(x, -2.0, 2.0)) < KS_LIMIT


def test_squashed_gaussian_samples_are_squashed_normals():
    spec = get_action_dist(gs.Box(-1, 1, (1,)), dist_type="squashed_gaussian", dist_kwargs={"low": 0.0, "high": 4.0})
    draws = _draws(spec, np.array([0.2, math.log(0.7)]))[:, 0]
    assert np.all((draws >= 0.0) & (draws <= 4.0))
    unsquashed = np.arctanh(np.clip(draws / 4.0 * 2.0 - 1.0, -1 + 1e-6, 1 - 1e-6))
    assert _ks_statistic(unsquashed, lambda x: _normal_cdf(x, 0.2, 0.7)) < KS_LIMIT


def test_beta_sample_moments():
    spec = get_action_dist(gs.Box(0, 1, (1,)), dist_type="beta", dist_kwargs={"low": -1.0, "high": 3.0})
    row = np.array([0.4, -0.3], np.float32)
    draws = _draws(spec, row)[:, 0]
    a, b = (math.log(math.exp(v) + 1) + 1 for v in row)
    unit = (draws + 1.0) / 4.0
    mean, var = a / (a + b), a * b / ((a + b) ** 2 * (a + b + 1))
    assert np.all((draws >= -1.0) & (draws <= 3.0))
    assert abs(unit.mean() - mean) < 5 * math.sqrt(var / N_DRAWS)
    assert abs(unit.var() - var) < 0.05 * var


def test_dirichlet_sample_moments():
    row = np.log(np.array([0.5, 1.0, 3.0], np.float32))
    draws = _draws(get_action_dist(Simplex((3,))), row)
    conc = np.exp(row) + 1e-7
    mean = conc / conc.sum()
    var = mean * (1 - mean) / (conc.sum() + 1)
    assert np.allclose(draws.sum(axis=1), 1.0, atol=1e-5) and np.all(draws >= 0)
    assert np.all(np.abs(draws.mean(axis=0) - mean) < 5 * np.sqrt(var / N_DRAWS))


@pytest.mark.parametrize(
    "space,dist_type",
    [
        (gs.Discrete(4), None),
        (gs.MultiDiscrete([2, 3]), None),
        (gs.Box(-2, 1, (3,), np.int64), None),
        (gs.Box(-1, 1, (2,)), None),
        (gs.Box(-1, 1, (2,)), "squashed_gaussian"),
        (gs.Box(0, 1, (2,)), "beta"),
        (Simplex((3,)), None),
        (gs.Tuple([gs.Discrete(3), gs.Box(-1, 1, (2,))]), None),
    ],
)
def test_same_seed_same_samples_and_finite_logp(space, dist_type):
    spec = get_action_dist(space, dist_type=dist_type)
    x = _inputs(64, spec.num_outputs)
    a = spec.build(x).sample(np.random.default_rng(3))
    dist = spec.build(x)
    b = dist.sample(np.random.default_rng(3))
    c = spec.build(x).sample(np.random.default_rng(4))
    flat = [np.asarray(v) for v in (a if isinstance(a, tuple) else (a,))]
    for u, v in zip(flat, b if isinstance(b, tuple) else (b,), strict=True):
        np.testing.assert_array_equal(u, v)
    assert any(not np.array_equal(u, w) for u, w in zip(flat, c if isinstance(c, tuple) else (c,), strict=True))
    logp = dist.sampled_action_logp()
    assert logp.shape == (len(x),) and np.all(np.isfinite(logp))


# --------------------------------------------------------------------------- defined errors

def test_undefined_methods_raise_documented_errors():
    det = get_action_dist(gs.Box(-1, 1, (2,)), dist_type="deterministic").build(np.ones((3, 2), np.float32))
    with pytest.raises(UnsupportedMethodError, match="logp"):
        det.logp(np.zeros((3, 2)))
    with pytest.raises(UnsupportedMethodError, match="entropy"):
        det.entropy()
    np.testing.assert_array_equal(det.sample(np.random.default_rng(0)), np.ones((3, 2)))
    np.testing.assert_array_equal(det.sampled_action_logp(), np.zeros(3))
    assert issubclass(UnsupportedMethodError, DistributionError) and issubclass(DistributionError, ValueError)


def test_out_of_support_actions_raise():
    spec = get_action_dist(gs.Box(-1, 2, (2,), np.int64))
    dist = spec.build(_inputs(2, spec.num_outputs))
    with pytest.raises(ActionOutOfSupportError, match=r"\[0, 3\]"):
        dist.logp(np.array([[-1, 0]] * 4))  # raw env values, not indices
    assert np.all(np.isfinite(dist.logp(np.array([[0, 3]] * 4))))
    cat = get_action_dist(gs.Discrete(3)).build(np.zeros((2, 3), np.float32))
    with pytest.raises(ActionOutOfSupportError):
        cat.logp(np.array([0, 3]))
    with pytest.raises(ActionOutOfSupportError):
        cat.logp(np.array([0.5, 1.0]))
    beta = get_action_dist(gs.Box(0, 1, (1,)), dist_type="beta").build(np.zeros((2, 2), np.float32))
    with pytest.raises(ActionOutOfSupportError):
        beta.logp(np.array([[0.5], [1.5]], np.float32))
    with pytest.raises(DistributionError, match="NaN"):
        get_action_dist(gs.Discrete(2)).build(np.array([[0.0, np.nan]], np.float32))


def test_bad_input_shapes_raise_value_errors():
    spec = get_action_dist(gs.Discrete(3))
    with pytest.raises(ValueError, match=r"\(B, 3\)"):
        spec.build(np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match="batch"):
        spec.build(np.zeros((2, 3), np.float32)).logp(np.array([0, 1, 2]))
    with pytest.raises(DistributionError, match="sample"):
        spec.build(np.zeros((2, 3), np.float32)).sampled_action_logp()


def test_masked_logits_stay_finite():
    x = np.array([[0.1, -3.4e38, 0.2], [-3.4e38, -3.4e38, 1.0]], np.float32)
    dist = get_action_dist(gs.Discrete(3)).build(x)
    assert np.all(np.isfinite(dist.entropy())) and np.all(np.isfinite(dist.logp_each_action()))
    assert dist.logp(np.array([1, 0]))[0] < -1e38
    np.testing.assert_array_equal(dist.deterministic_sample(), [2, 2])


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


# --------------------------------------------------------------------------- catalog

@pytest.mark.parametrize(
    "space,name,num",
    [
        (gs.Discrete(7, start=3), "TorchCategorical", 7),
        (gs.MultiDiscrete([2, 5]), "TorchMultiCategorical", 7),
        (gs.Box(-1, 1, (3,)), "TorchDiagGaussian", 6),
        (gs.Box(-1, 1, ()), "TorchDiagGaussian", 2),
        (gs.Box(0, 255, (2,), np.uint8), "TorchDiagGaussian", 4),  # RLlib tests dtype.name.startswith("int")
        (gs.Box(np.array([-1, 0]), np.array([2, 4]), dtype=np.int32), "TorchMultiCategorical", 12),
        (Simplex((5,)), "TorchDirichlet", 5),
        (gs.Dict({"b": gs.Discrete(2), "a": gs.Box(-1, 1, (2,))}), "TorchMultiActionDistribution", 6),
    ],
)
def test_catalog_rule(space, name, num):
    spec = get_action_dist(space, {"free_log_std": True})
    assert (spec.name, spec.num_outputs) == (name, num)
    back = ActionDistSpec.from_json(json.loads(json.dumps(spec.to_json())))
    assert back == spec
    assert back.build(np.zeros((2, num), np.float32)).entropy().shape[0] == 2


def test_int_box_uses_global_bounds_and_index_actions():
    spec = get_action_dist(gs.Box(np.array([-1, 0]), np.array([2, 4]), dtype=np.int64))
    assert spec.kwargs["input_lens"] == [6, 6]  # max(high) - min(low) + 1 for every element
    mode = spec.build(np.tile(np.eye(6, dtype=np.float32)[5] * 9, (1, 2))).deterministic_sample()
    np.testing.assert_array_equal(mode, [[5, 5]])  # indices, not values shifted by low


def test_dict_children_follow_sorted_keys_and_keep_space_order():
    space = gs.Dict([("z", gs.Discrete(3)), ("a", gs.Box(-1, 1, (2,))), ("m", gs.MultiDiscrete([2, 2]))])
    spec = get_action_dist(space)
    assert [c.name for c in spec.children] == ["TorchDiagGaussian", "TorchMultiCategorical", "TorchCategorical"]
    assert spec.kwargs["input_lens"] == [4, 4, 3]
    x = _inputs(5, spec.num_outputs)
    dist = spec.build(x)
    mode = dist.deterministic_sample()
    assert list(mode) == ["z", "a", "m"]
    np.testing.assert_array_equal(mode["z"], np.argmax(x[:, 8:11], axis=1))
    _close(mode["a"], x[:, :2])
    flat = flatten_actions(space, mode)  # a(2) | m(2) | z(1)
    _close(dist.logp(flat), dist.logp(mode))
    _close(dist.entropy(), sum(c.entropy() for c in dist.children))
    logp_sum = sum(c.logp(v) for c, v in zip(dist.children, (mode["a"], mode["m"], mode["z"]), strict=True))
    _close(dist.logp(mode), logp_sum)


def test_nested_tuple_actions():
    space = gs.Tuple([gs.Discrete(2), gs.Tuple([gs.Box(-1, 1, (1,)), gs.Discrete(3)])])
    spec = get_action_dist(space)
    assert spec.num_outputs == 2 + 2 + 3
    sample = spec.build(_inputs(4, 7)).sample(np.random.default_rng(0))
    assert isinstance(sample, tuple) and isinstance(sample[1], tuple) and sample[1][1].shape == (6,)
    assert action_width(space) == 3


@pytest.mark.parametrize(
    "space", [gs.MultiBinary(3), gs.Box(-1, 1, (2, 2)), Repeated(gs.Discrete(2), 3), gs.Tuple([gs.MultiBinary(2)])]
)
def test_unsupported_action_spaces(space):
    with pytest.raises(UnsupportedActionSpaceError, match="supported|dimension"):
        get_action_dist(space)


def test_explicit_dist_types():
    box = gs.Box(-1, 1, (3,))
    assert get_action_dist(box, dist_type="TorchSquashedGaussian").kwargs == {}
    assert get_action_dist(box, dist_type="deterministic").num_outputs == 3
    assert get_action_dist(box, dist_type="Beta", dist_kwargs={"low": -1, "high": 1}).kwargs == {"low": -1, "high": 1}
    with pytest.raises(ValueError, match="Box"):
        get_action_dist(gs.Discrete(3), dist_type="beta")
    with pytest.raises(ValueError, match="not a distribution"):
        get_action_dist(box, dist_type="gamma")
    with pytest.raises(ValueError, match="allowed"):
        get_action_dist(box, dist_type="beta", dist_kwargs={"scale": 2})


# --------------------------------------------------------------------------- registry

class SevenWay(ActionDistribution):
    """A custom distribution: uniform over 7 actions whatever the inputs."""

    @staticmethod
    def required_model_output_shape(action_space, model_config):
        return 7

    @classmethod
    def dist_kwargs(cls, action_space, model_config):
        return {"bias": model_config.get("custom_model_config", {}).get("bias", 0)}

    def __init__(self, inputs, bias=0):
        super().__init__(inputs)
        self.bias = bias

    def _sample(self, rng):
        return rng.integers(0, 7, size=self.batch_size) + self.bias

    def _mode(self):
        return np.full(self.batch_size, self.bias)

    def logp(self, actions):
        return np.full(self.batch_size, -math.log(7), np.float32)

    def entropy(self):
        return np.full(self.batch_size, math.log(7), np.float32)


class MyMulti(MultiActionDistribution):
    pass


@pytest.fixture
def registered():
    register_action_dist("seven", SevenWay)
    register_action_dist("my_multi", MyMulti)
    yield
    unregister_action_dist("seven")
    unregister_action_dist("my_multi")


def test_custom_action_dist(registered):
    config = {"custom_action_dist": "seven", "custom_model_config": {"bias": 2}}
    spec = get_action_dist(gs.Discrete(3), config)
    assert (spec.name, spec.num_outputs, spec.custom, spec.kwargs) == ("seven", 7, True, {"bias": 2})
    dist = ActionDistSpec.from_json(json.loads(json.dumps(spec.to_json()))).build(np.zeros((4, 7), np.float32))
    assert isinstance(dist, SevenWay) and list(dist.deterministic_sample()) == [2] * 4
    multi = get_action_dist(gs.Tuple([gs.Discrete(2), gs.Discrete(3)]), {"custom_action_dist": "my_multi"})
    assert multi.num_outputs == 5 and [c.name for c in multi.children] == ["TorchCategorical"] * 2
    assert isinstance(multi.build(np.zeros((1, 5), np.float32)), MyMulti)


def test_unknown_custom_name_lists_registered(registered):
    with pytest.raises(UnknownActionDistError) as info:
        get_action_dist(gs.Discrete(3), {"custom_action_dist": "nope"})
    # The names registered here, beside the built-in example dists (binary_autoreg_dist, ...).
    assert "'my_multi'" in str(info.value) and "'seven'" in str(info.value)
    assert "'binary_autoreg_dist'" in str(info.value)
    with pytest.raises(TypeError):
        register_action_dist("bad", dict)  # type: ignore[arg-type]


def test_package_is_torch_free():
    import subprocess
    import sys
    from pathlib import Path

    code = "import sys, rlserve.models.distributions; print('torch' in sys.modules)"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "False", out.stderr
