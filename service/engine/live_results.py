"""Per-version live results: what each loaded version did with the traffic it served.

For every (model, version) one ``VersionResults``: requests answered and their latency
(``request``: two additions and a bounded append on the answer's path), and the episodes
that finished there (``episode``: once per episode, from what the client already sends:
rewards with the next step, ``terminated``/``truncated``, a restart, a session's end),
folded with Welford's update into count, mean and spread of the return and mean length.

``LiveResults`` holds them for one app; its ``collect`` puts them on ``/metrics`` labelled
by model and version, and ``summary`` gives one model's as JSON (the admin API's
``summary``). Episodes that finish are handed to the ``on_episode`` listener
(the rollout guard) after they are counted.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

RECENT = 2048  # latencies kept per version for the JSON summary's percentiles

# on_episode(model, version): called after an episode of that version was counted.
EpisodeListener = Callable[[str, str], None]


class VersionResults:
    """One version's running totals (event-loop thread only)."""

    __slots__ = ("requests", "latency_sum", "recent", "episodes", "return_mean", "_m2", "length_sum")

    def __init__(self) -> None:
        self.requests = 0
        self.latency_sum = 0.0
        self.recent: deque[float] = deque(maxlen=RECENT)
        self.episodes = 0
        self.return_mean = 0.0
        self._m2 = 0.0  # Welford: sum of squared deviations from the running mean
        self.length_sum = 0

    def request(self, seconds: float) -> None:
        self.requests += 1
        self.latency_sum += seconds
        self.recent.append(seconds)

    def episode(self, episode_return: float, length: int) -> None:
        self.episodes += 1
        delta = episode_return - self.return_mean
        self.return_mean += delta / self.episodes
        self._m2 += delta * (episode_return - self.return_mean)
        self.length_sum += length

    @property
    def return_std(self) -> float:
        """The population standard deviation of the finished episodes' returns (0 for fewer than 2)."""
        return math.sqrt(self._m2 / self.episodes) if self.episodes > 1 else 0.0

    def as_json(self) -> dict[str, Any]:
        recent = np.fromiter(self.recent, np.float64, len(self.recent))
        p50, p95 = (np.percentile(recent, [50, 95]) * 1e3).tolist() if len(recent) else (None, None)
        return {
            "requests": self.requests,
            "latency_ms": {"mean": round(self.latency_sum / self.requests * 1e3, 4) if self.requests else None,
                           "p50": None if p50 is None else round(p50, 4),
                           "p95": None if p95 is None else round(p95, 4),
                           "of_last": len(recent)},
            "episodes": self.episodes,
            "return_mean": self.return_mean if self.episodes else None,
            "return_std": self.return_std if self.episodes else None,
            "episode_length_mean": self.length_sum / self.episodes if self.episodes else None,
        }


class LiveResults:
    """Every (model, version)'s ``VersionResults`` of one app, and their Prometheus families."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str], VersionResults] = {}
        self.on_episode: EpisodeListener | None = None

    def of(self, model: str, version: str) -> VersionResults:
        results = self._by_key.get((model, version))
        if results is None:
            results = self._by_key[(model, version)] = VersionResults()
        return results

    def episode(self, model: str, version: str, episode_return: float, length: int) -> None:
        if not math.isfinite(episode_return):
            return  # a reward the client sent as a huge number overflowed the sum: not a result
        self.of(model, version).episode(episode_return, length)
        if self.on_episode is not None:
            self.on_episode(model, version)

    def summary(self, model: str, versions: list[str]) -> dict[str, dict[str, Any]]:
        """The versions' results as JSON (a loaded version that served nothing yet: zeros)."""
        return {version: self.of(model, version).as_json() for version in versions}

    # ------------------------------------------------------------------ Prometheus

    def collect(self):
        labels = ["model", "version"]
        requests = CounterMetricFamily("rlserve_version_requests", "Requests answered per model version", labels=labels)
        latency = CounterMetricFamily("rlserve_version_request_seconds",
                                      "Total seconds of the requests answered per model version", labels=labels)
        episodes = CounterMetricFamily("rlserve_version_episodes", "Episodes finished per model version",
                                       labels=labels)
        mean = GaugeMetricFamily("rlserve_version_return_mean", "Mean return of the finished episodes",
                                 labels=labels)
        std = GaugeMetricFamily("rlserve_version_return_std", "Standard deviation of the finished episodes' returns",
                                labels=labels)
        length = GaugeMetricFamily("rlserve_version_episode_length_mean", "Mean length of the finished episodes",
                                   labels=labels)
        for (model, version), results in list(self._by_key.items()):
            key = [model, version]
            requests.add_metric(key, results.requests)
            latency.add_metric(key, results.latency_sum)
            episodes.add_metric(key, results.episodes)
            if results.episodes:
                mean.add_metric(key, results.return_mean)
                std.add_metric(key, results.return_std)
                length.add_metric(key, results.length_sum / results.episodes)
        yield from (requests, latency, episodes, mean, std, length)

    def describe(self):
        return []
