"""Off-policy estimates of a candidate policy's return from logged episodes (pure numpy).

The definitions are those of RLlib's old-stack estimators (``ray.rllib.offline.estimators``),
written here from their formulas. For episode ``i`` of length ``T_i``, rewards ``r_t``,
the per-step ratio ``rho_t = pi_e(a_t|s_t) / pi_b(a_t|s_t)`` and the cumulative ratio
``w_t = rho_0 * ... * rho_t``:

- ``is`` (RLlib's ``ImportanceSampling``, per-decision): the mean over episodes of
  ``sum_t gamma^t w_t r_t``.
- ``wis`` (RLlib's ``WeightedImportanceSampling``, per-decision): each ``w_t`` divided by
  ``wbar_t``, the mean of ``w_t`` over the episodes that reached step ``t`` (RLlib's
  ``cummulative_ips_values[t] / episode_timestep_count[t]``, gathered over every episode
  of the batch before any is estimated); then the mean over episodes of
  ``sum_t gamma^t (w_t / wbar_t) r_t``. Where ``wbar_t`` is 0 (every weight at ``t`` is 0)
  the step adds nothing (RLlib would divide by zero).
- ``is_trajectory``: the mean of ``W_i G_i``, with ``W_i = w_{T_i-1}`` the episode's whole
  ratio and ``G_i = sum_t gamma^t r_t`` its return; ``wis_trajectory``: ``sum W_i G_i /
  sum W_i`` (RLlib has neither; these are the textbook trajectory-wise forms).
- ``dr`` (RLlib's ``DoublyRobust`` recursion, ``V_T = 0``, ``V_t = V(s_t) + rho_t (r_t +
  gamma V_{t+1} - Q(s_t, a_t))``) with the candidate's value head as its model and
  ``Q(s_t, a_t) = V(s_t)``, unrolled: ``sum_t gamma^t (w_{t-1} V(s_t) + w_t (r_t - V(s_t)))``,
  ``w_{-1} = 1``. (``Q = r_t + gamma V(s_{t+1})`` of the logged next state would cancel
  every reward: the estimate would collapse to ``V(s_0)``.)
- ``behaviour``: the mean discounted return ``G_i`` of the logged episodes.

``clip`` caps every cumulative weight ``w_t`` (and so ``W_i``) at ``clip``. Bootstrap
intervals resample episodes with replacement and compute each estimator again on the
resample (WIS's ``wbar_t`` included), percentile method.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ESTIMATORS = ("is", "wis", "is_trajectory", "wis_trajectory", "dr")


@dataclass(frozen=True)
class Padded:
    """E episodes padded to the longest (E, T): rewards, per-step ratios, values (or None),
    and ``mask`` (True where the episode has step t)."""

    rewards: np.ndarray
    ratios: np.ndarray
    mask: np.ndarray
    values: np.ndarray | None = None

    @classmethod
    def from_lists(cls, rewards: list[np.ndarray], ratios: list[np.ndarray],
                   values: list[np.ndarray] | None = None) -> Padded:
        lengths = [len(r) for r in rewards]
        longest = max(lengths, default=0)
        mask = np.arange(longest)[None, :] < np.asarray(lengths)[:, None]

        def pad(rows: list[np.ndarray], fill: float) -> np.ndarray:
            out = np.full((len(rows), longest), fill, np.float64)
            out[mask] = np.concatenate(rows) if rows else []
            return out

        return cls(pad(rewards, 0.0), pad(ratios, 1.0), mask, None if values is None else pad(values, 0.0))

    @property
    def episodes(self) -> int:
        return int(self.mask.shape[0])


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float
    ess: float | None  # the effective sample size of the weights (None: the behaviour's own return)


def cumulative_weights(data: Padded, clip: float | None) -> np.ndarray:
    """(E, T) ``w_t``, 0 past each episode's end, capped at ``clip``."""
    w = np.cumprod(data.ratios, axis=1)
    if clip is not None:
        w = np.minimum(w, clip)
    return np.where(data.mask, w, 0.0)


def trajectory_weights(w: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(E,) each episode's last cumulative weight (1 for an empty episode)."""
    last = mask.sum(axis=1) - 1
    return np.where(last >= 0, w[np.arange(w.shape[0]), np.maximum(last, 0)], 1.0)


def effective_sample_size(weights: np.ndarray) -> float:
    """Kish's (sum w)^2 / sum w^2 (0 when every weight is 0)."""
    total = float(np.sum(weights ** 2))
    return float(np.sum(weights) ** 2 / total) if total > 0 else 0.0


class Estimators:
    """Every estimator on one set of episodes, and again on bootstrap resamples.

    Each estimator is a function of per-episode sums weighted by resampling counts ``c``
    (N, E): the full sample is ``c = 1``. So a resample costs a few matrix products."""

    def __init__(self, data: Padded, gamma: float, clip: float | None = None):
        self.data = data
        discount = gamma ** np.arange(data.mask.shape[1], dtype=np.float64)
        self.w = cumulative_weights(data, clip)
        self.discounted = data.rewards * discount * data.mask  # (E, T) gamma^t r_t
        self.returns = self.discounted.sum(axis=1)  # (E,) G_i
        self.per_decision = (self.w * self.discounted).sum(axis=1)  # (E,) sum_t gamma^t w_t r_t
        self.W = trajectory_weights(self.w, data.mask)
        self._wr = self.w * self.discounted  # (E, T) for WIS's per-step sums
        self.dr = None
        if data.values is not None:
            before = np.concatenate([np.ones((self.w.shape[0], 1)), self.w[:, :-1]], axis=1)
            terms = before * data.values + self.w * (data.rewards - data.values)
            self.dr = (terms * discount * data.mask).sum(axis=1)

    def names(self) -> list[str]:
        return [n for n in ESTIMATORS if n != "dr" or self.dr is not None]

    def values(self, counts: np.ndarray) -> dict[str, np.ndarray]:
        """Each estimator (and ``behaviour``) on each row of resampling counts ``counts`` (N, E)."""
        n = counts.sum(axis=1)
        out = {
            "behaviour": counts @ self.returns / n,
            "is": counts @ self.per_decision / n,
            "wis": self._wis(counts) / n,
            "is_trajectory": counts @ (self.W * self.returns) / n,
            "wis_trajectory": _ratio(counts @ (self.W * self.returns), counts @ self.W),
        }
        if self.dr is not None:
            out["dr"] = counts @ self.dr / n
        return out

    def _wis(self, counts: np.ndarray) -> np.ndarray:
        reached = counts @ self.data.mask.astype(np.float64)  # (N, T) episodes at step t
        mean_w = _ratio(counts @ self.w, reached)  # (N, T) wbar_t
        numerators = counts @ self._wr  # (N, T) sum_i w_it gamma^t r_it
        return np.where(mean_w > 0, numerators / np.where(mean_w > 0, mean_w, 1.0), 0.0).sum(axis=1)

    def wis_point(self) -> float:
        """WIS on the whole sample summed per episode first, as RLlib does (so with every
        ratio 1 it is the behaviour's return to the last bit)."""
        mean_w = _ratio(self.w.sum(axis=0), self.data.mask.sum(axis=0).astype(np.float64))  # (T,)
        scale = np.where(mean_w > 0, self.w / np.where(mean_w > 0, mean_w, 1.0), 0.0)
        e = self.data.episodes
        return float((np.ones((1, e)) @ (scale * self.discounted).sum(axis=1) / e)[0]) if e else float("nan")

    def ess(self, name: str) -> float | None:
        """The ESS of the weights an estimator uses: every one uses the episodes' cumulative
        weights, whose last value ``W_i`` is the trajectory's (reported for all)."""
        return None if name == "behaviour" else effective_sample_size(self.W)

    def estimate(self, bootstrap: int, seed: int, level: float = 0.95) -> dict[str, Estimate]:
        """Every estimator with its ``level`` percentile interval over ``bootstrap`` resamples."""
        e = self.data.episodes
        point = {k: float(v[0]) for k, v in self.values(np.ones((1, e))).items()}
        point["wis"] = self.wis_point()
        if bootstrap > 0 and e > 0:
            draws = self.values(resample_counts(e, bootstrap, seed))
        else:
            draws = {k: np.array([v]) for k, v in point.items()}
        tail = (1.0 - level) / 2 * 100
        out = {}
        for name, value in point.items():
            low, high = np.nanpercentile(draws[name], [tail, 100 - tail]) if np.isfinite(draws[name]).any() \
                else (np.nan, np.nan)
            out[name] = Estimate(value, float(low), float(high), self.ess(name))
        return out


def resample_counts(episodes: int, draws: int, seed: int) -> np.ndarray:
    """(draws, episodes): how often each episode is drawn in each resample of ``episodes``."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, episodes, size=(draws, episodes))
    counts = np.zeros((draws, episodes), np.float64)
    np.add.at(counts, (np.arange(draws)[:, None], picks), 1.0)
    return counts


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
