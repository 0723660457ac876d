"""RLlib's off-policy estimators written plainly from their formulas, in loops over episodes
and steps as ``ray.rllib.offline.estimators`` reads (``ImportanceSampling``,
``WeightedImportanceSampling``, ``DoublyRobust``), for the tests to hold rlserve's vectorised
ones (``service/experience/estimators.py``) to. An episode is a dict of lists: ``rewards``,
``old_logp`` (the behaviour's), ``new_logp`` (the candidate's) and, for DR, ``values``."""

from __future__ import annotations

import math

import numpy as np


def _cumulative(e, clip=None):
    p, out = 1.0, []
    for new, old in zip(e["new_logp"], e["old_logp"], strict=True):
        p = p * math.exp(new) / math.exp(old)  # RLlib: new_prob / action_prob, multiplied up to t
        out.append(p if clip is None else min(p, clip))
    return out


def plain_is(episodes, gamma, clip=None):
    totals = []
    for e in episodes:
        weights = _cumulative(e, clip)
        totals.append(sum(gamma ** t * weights[t] * r for t, r in enumerate(e["rewards"])))
    return float(np.mean(totals))


def plain_wis(episodes, gamma, clip=None):
    cumulative = [_cumulative(e, clip) for e in episodes]
    sums, counts = {}, {}
    for ps in cumulative:  # RLlib's peek pass: every episode before any estimate
        for t, p in enumerate(ps):
            sums[t] = sums.get(t, 0.0) + p
            counts[t] = counts.get(t, 0.0) + 1.0
    totals = []
    for e, ps in zip(episodes, cumulative, strict=True):
        totals.append(sum(gamma ** t * ps[t] / (sums[t] / counts[t]) * r for t, r in enumerate(e["rewards"])))
    return float(np.mean(totals))


def plain_trajectory(episodes, gamma, weighted):
    weights = [_cumulative(e)[-1] for e in episodes]
    returns = [sum(gamma ** t * r for t, r in enumerate(e["rewards"])) for e in episodes]
    total = sum(w * g for w, g in zip(weights, returns, strict=True))
    return total / sum(weights) if weighted else total / len(episodes)


def plain_dr(episodes, gamma):
    """RLlib's DoublyRobust recursion, with Q(s_t, a_t) = V(s_t)."""
    out = []
    for e in episodes:
        v_target = 0.0
        for t in reversed(range(len(e["rewards"]))):
            rho = math.exp(e["new_logp"][t]) / math.exp(e["old_logp"][t])
            v = e["values"][t]
            v_target = v + rho * (e["rewards"][t] + gamma * v_target - v)
        out.append(v_target)
    return float(np.mean(out))
