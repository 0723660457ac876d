"""The off-policy estimators (``service/experience/estimators.py``) against an independent
implementation of RLlib's formulas, written here plainly (loops over episodes and steps, as
RLlib's ``ImportanceSampling``, ``WeightedImportanceSampling`` and ``DoublyRobust`` read),
and once against RLlib's own estimator classes run in an environment with ray."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from ope_formulas import plain_dr, plain_is, plain_trajectory, plain_wis
from ray_venv import ray_python

from rlserve.service.experience.estimators import Estimators, Padded, effective_sample_size, resample_counts

RLLIB_SCRIPT = Path(__file__).with_name("rllib_ope_check.py")


def _episodes(seed: int, n: int = 12):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(1, 15))
        out.append({"rewards": rng.normal(1.0, 2.0, length).tolist(),
                    "old_logp": np.log(rng.uniform(0.05, 1.0, length)).tolist(),
                    "new_logp": np.log(rng.uniform(0.05, 1.0, length)).tolist(),
                    "values": rng.normal(3.0, 1.0, length).tolist()})
    return out


def _padded(episodes, clip_free=True) -> Padded:
    return Padded.from_lists([np.array(e["rewards"]) for e in episodes],
                             [np.exp(np.array(e["new_logp"]) - np.array(e["old_logp"])) for e in episodes],
                             [np.array(e["values"]) for e in episodes])


@pytest.mark.parametrize("gamma", [1.0, 0.95])
def test_every_estimator_equals_the_plain_formulas(gamma):
    episodes = _episodes(1)
    got = Estimators(_padded(episodes), gamma).estimate(bootstrap=0, seed=0)
    expected = {"is": plain_is(episodes, gamma), "wis": plain_wis(episodes, gamma),
                "is_trajectory": plain_trajectory(episodes, gamma, False),
                "wis_trajectory": plain_trajectory(episodes, gamma, True), "dr": plain_dr(episodes, gamma),
                "behaviour": float(np.mean([sum(gamma ** t * r for t, r in enumerate(e["rewards"]))
                                            for e in episodes]))}
    for name, value in expected.items():
        assert got[name].value == pytest.approx(value, rel=1e-9, abs=0), name


def test_clipped_weights_cap_every_cumulative_weight():
    episodes = _episodes(2)
    got = Estimators(_padded(episodes), 0.99, clip=1.5).estimate(bootstrap=0, seed=0)
    assert got["is"].value == pytest.approx(plain_is(episodes, 0.99, clip=1.5), rel=1e-9)
    assert got["wis"].value == pytest.approx(plain_wis(episodes, 0.99, clip=1.5), rel=1e-9)
    assert got["is"].value != pytest.approx(plain_is(episodes, 0.99), rel=1e-6)  # the clip bit


def test_ratios_of_one_give_the_behaviour_return_to_the_last_bit():
    episodes = _episodes(3)
    for e in episodes:
        e["new_logp"] = list(e["old_logp"])
    got = Estimators(_padded(episodes), 0.97).estimate(bootstrap=200, seed=5)
    behaviour = got.pop("behaviour")
    for name in ("is", "wis", "is_trajectory", "wis_trajectory"):
        assert got[name].value == behaviour.value, name
        assert got[name].ess == len(episodes)


def test_bootstrap_is_seeded_and_resamples_episodes():
    data = _padded(_episodes(4))
    first = Estimators(data, 1.0).estimate(bootstrap=300, seed=11)
    again = Estimators(data, 1.0).estimate(bootstrap=300, seed=11)
    other = Estimators(data, 1.0).estimate(bootstrap=300, seed=12)
    assert first == again and first["is"] != other["is"]
    for e in first.values():
        assert e.low <= e.high
    counts = resample_counts(12, 300, 11)
    assert (counts.sum(axis=1) == 12).all()
    # The resampled WIS (matrix form) on one resample equals the plain formula on the drawn episodes.
    episodes = _episodes(4)
    drawn = [episodes[i] for i in np.repeat(np.arange(12), counts[0].astype(int))]
    assert Estimators(data, 1.0).values(counts[:1])["wis"][0] == pytest.approx(plain_wis(drawn, 1.0), rel=1e-9)


def test_effective_sample_size():
    assert effective_sample_size(np.ones(7)) == 7
    assert effective_sample_size(np.array([1.0, 0.0, 0.0])) == 1
    assert effective_sample_size(np.zeros(3)) == 0


def test_rllib_estimators_agree(tmp_path):
    """RLlib 2.60's own ImportanceSampling and WeightedImportanceSampling on the same episodes."""
    episodes = _episodes(5)
    done = subprocess.run([str(ray_python(rllib_only=True)), str(RLLIB_SCRIPT)], capture_output=True, text=True,
                          input=json.dumps({"gamma": 0.95, "episodes": episodes}), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rllib = json.loads(done.stdout.strip().splitlines()[-1])
    got = Estimators(_padded(episodes), 0.95).estimate(bootstrap=0, seed=0)
    assert got["is"].value == pytest.approx(rllib["is"], rel=1e-9)
    assert got["wis"].value == pytest.approx(rllib["wis"], rel=1e-9)
