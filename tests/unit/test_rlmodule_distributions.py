"""The new stack's squashed Gaussian (SAC's RLModule distribution) against RLlib's torch arithmetic.

RLlib 2.60 (``ray.rllib.core.distribution.torch.torch_distribution.TorchSquashedGaussian``):
``from_logits`` clamps log_std to [-5, 2]; ``logp(a)`` is ``Normal(loc, std).log_prob(u).sum(-1)
- sum(2 (log 2 - u - softplus(-2u)))`` with ``u = atanh(clip(a, -1 + 1e-6, 1 - 1e-6))``; a sample
is ``clip(tanh(z))``; the deterministic action is ``loc`` itself. Written out here in torch
op for op, on made-up dist inputs that push the clamps.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from rlserve.models.distributions import ActionDistSpec, RLModuleSquashedGaussian


def _rllib_logp(inputs: np.ndarray, actions: np.ndarray) -> np.ndarray:
    logits = torch.from_numpy(inputs)
    loc, log_std = logits.chunk(2, dim=-1)
    log_std = torch.clamp(log_std, -5, 2)
    normal = torch.distributions.Normal(loc, log_std.exp(), validate_args=False)
    value = torch.from_numpy(actions)
    u = torch.atanh(torch.clamp((value - -1.0) / 2.0 * 2.0 - 1.0, -1.0 + 1e-6, 1.0 - 1e-6))
    jacobian = 2.0 * (math.log(2.0) - u - torch.nn.functional.softplus(-2.0 * u))
    return (normal.log_prob(u).sum(-1) - jacobian.sum(-1)).numpy()


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(0)
    rows = [rng.normal(0, 2, 6) for _ in range(5)]
    rows.append(np.array([0.3, -0.2, 25.0, -9.0, -14.0, 3.0]))  # log_std far outside [-5, 2]
    return np.asarray(rows, np.float32)


def test_logp_of_inner_edge_and_outside_actions_matches_rllib() -> None:
    inputs = _inputs()
    dist = RLModuleSquashedGaussian(inputs, low=-1.0, high=1.0)
    rng = np.random.default_rng(1)
    for actions in (rng.uniform(-0.99, 0.99, (6, 3)), np.tile([-1.0, 1.0, 0.0], (6, 1)), inputs[:, :3]):
        actions = actions.astype(np.float32)
        np.testing.assert_allclose(dist.logp(actions), _rllib_logp(inputs, actions), rtol=2e-6, atol=2e-5)


def test_the_deterministic_action_is_the_raw_mean_and_samples_are_squashed() -> None:
    inputs = _inputs()
    spec = ActionDistSpec.from_json({"class": "RLModuleTorchSquashedGaussian", "num_outputs": 6,
                                     "kwargs": {"low": -1.0, "high": 1.0}})
    dist = spec.build(inputs)
    np.testing.assert_array_equal(dist.deterministic_sample(), inputs[:, :3])  # not tanh(mean)
    sample = dist.sample(np.random.default_rng(2))
    assert sample.shape == (6, 3) and np.all(np.abs(sample) <= 1.0)
    np.testing.assert_allclose(dist.logp_of_sample(), _rllib_logp(inputs, sample), rtol=2e-6, atol=2e-5)
