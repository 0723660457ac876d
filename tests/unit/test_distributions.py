"""Unit tests of the numpy action distributions' numbers: log-probabilities, entropies and
modes against ``torch.distributions``, samples against their laws, and the defined errors.

Reference numbers come from ``torch.distributions`` (an independent implementation; the
test extra installs torch) and from closed-form moments checked on large seeded samples.
The Python-float path of small blocks is in test_distribution_small_blocks.py; the catalog
rule and the registry in test_distribution_catalog.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch  # the reference implementation (the test extra installs it)
from gymnasium import spaces as gs

from rlserve.models.distributions import (
    ActionDistSpec,
    ActionOutOfSupportError,
    DistributionError,
    UnsupportedMethodError,
    get_action_dist,
)
from rlserve.models.distributions._math import digamma, digamma32, lgamma
from rlserve.models.spaces import Simplex

from .distribution_helpers import _close, _inputs

RNG = np.random.default_rng(1234)  # the sampled actions compared against torch

td = torch.distributions


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
