"""Run by tests/service/test_ope_estimators.py with an interpreter that has RLlib: its old-stack
ImportanceSampling and WeightedImportanceSampling on episodes given as JSON on stdin
(rewards, the behaviour's and the candidate's logp per step); prints their v_target as JSON.

The estimators get the candidate's probabilities from the batch instead of a Policy: the
rest of their code (ratios, WIS's per-step means, the mean over episodes) runs as it is."""

import json
import sys

import numpy as np
from ray.rllib.offline.estimators import ImportanceSampling, WeightedImportanceSampling
from ray.rllib.policy.sample_batch import SampleBatch, concat_samples


def estimator(cls, gamma):
    est = cls.__new__(cls)  # no Policy: what OffPolicyEstimator.__init__ would set, by hand
    est.gamma, est.epsilon_greedy = gamma, 0.0
    if cls is WeightedImportanceSampling:
        est.cummulative_ips_values, est.episode_timestep_count, est.p = [], [], {}
    est.compute_action_probs = lambda batch: np.asarray(batch["new_prob"])
    return est


def main():
    data = json.load(sys.stdin)
    batch = concat_samples([
        SampleBatch({"eps_id": np.array([i] * len(e["rewards"])), "rewards": np.array(e["rewards"]),
                     "action_prob": np.exp(np.array(e["old_logp"])), "new_prob": np.exp(np.array(e["new_logp"])),
                     "obs": np.zeros((len(e["rewards"]), 1)), "actions": np.zeros(len(e["rewards"]))})
        for i, e in enumerate(data["episodes"])])
    print(json.dumps({name: float(estimator(cls, data["gamma"]).estimate(batch)["v_target"])
                      for name, cls in (("is", ImportanceSampling), ("wis", WeightedImportanceSampling))}))


if __name__ == "__main__":
    main()
