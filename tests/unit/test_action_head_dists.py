"""EpsilonGreedyQ, BinaryAutoregressive and the q_model config, beyond the recorded cases."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlserve.models.catalog import build_model
from rlserve.models.config import ConfigError
from rlserve.models.distributions import FLOAT_MIN, BinaryAutoregressive, EpsilonGreedyQ
from rlserve.models.rllib_import import rllib_key_candidates

DRAWS = 40_000


def test_epsilon_greedy_samples_its_own_probabilities() -> None:
    q = np.array([[1.0, 3.0, 2.0, FLOAT_MIN]], np.float32).repeat(DRAWS, 0)
    dist = EpsilonGreedyQ(q, epsilon=0.3)
    expected = dist.probs()[0]
    assert np.allclose(expected, [0.1, 0.8, 0.1, 0.0])  # the masked action has no mass
    freq = np.bincount(dist.sample(np.random.default_rng(0)), minlength=4) / DRAWS
    assert np.allclose(freq, expected, atol=0.01), freq
    assert np.allclose(np.exp(dist.logp(np.arange(4).repeat(DRAWS // 4))).reshape(4, -1)[:, 0], expected)
    p = expected[expected > 0]
    assert np.allclose(dist.entropy()[0], -(p * np.log(p)).sum(), rtol=1e-6)


def test_epsilon_zero_is_greedy_with_logp_zero() -> None:
    dist = EpsilonGreedyQ(np.array([[0.0, 2.0, 1.0]], np.float32), epsilon=0.0)
    assert dist.sample(np.random.default_rng(1)).tolist() == [1] == dist.deterministic_sample().tolist()
    assert dist.sampled_action_logp().tolist() == [0.0]


def test_binary_autoregressive_samples_a2_given_a1() -> None:
    inputs = np.array([[0.0, 1.0, 2.0, -1.0, -0.5, 0.5]], np.float32).repeat(DRAWS, 0)
    dist = BinaryAutoregressive(inputs)
    a1, a2 = dist.sample(np.random.default_rng(3))
    p1 = np.exp([0.0, 1.0]) / np.exp([0.0, 1.0]).sum()
    p2 = [np.exp(r) / np.exp(r).sum() for r in ([2.0, -1.0], [-0.5, 0.5])]
    joint = np.array([[p1[i] * p2[i][j] for j in range(2)] for i in range(2)])
    freq = np.bincount(a1 * 2 + a2, minlength=4).reshape(2, 2) / DRAWS
    assert np.allclose(freq, joint, atol=0.01), freq
    assert np.allclose(np.exp(dist.logp((a1, a2))), joint[a1, a2], rtol=1e-5)


@pytest.mark.parametrize(("dueling", "hiddens"), [(False, [16]), (True, []), (False, [])])
def test_other_q_heads_build_with_rllibs_names(dueling: bool, hiddens: list[int]) -> None:
    config = {"fcnet_hiddens": [8], "q_model": {"dueling": dueling, "hiddens": hiddens}}
    model = build_model(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(5), config)
    names = {n for group in rllib_key_candidates(model).values() for n in group}
    assert ("value_module.V._model.0.weight" in names) == (dueling and bool(hiddens))
    assert ("advantage_module.A._model.0.weight" in names) == bool(hiddens)
    # Without hiddens the base keeps its logits layer (num_outputs = n actions).
    assert ("_logits._model.0.weight" in names) == (not hiddens)
    q, value, *_ = model(torch.zeros(2, 3))
    assert q.shape == (2, 5) and torch.equal(value, q.max(1).values)


@pytest.mark.parametrize(("block", "key"), [
    ({"num_atoms": 51}, "q_model.num_atoms"),
    ({"noisy": True}, "q_model.noisy"),
    ({"hidens": [8]}, "q_model.hidens"),
    ({"epsilon": 2}, "q_model.epsilon"),
])
def test_unserved_q_settings_are_refused_by_name(block: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_model(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2), {"q_model": block})
    assert info.value.key == key
