"""FastHistogram agrees with prometheus_client's Histogram on every bucket."""

from __future__ import annotations

import numpy as np
from prometheus_client import CollectorRegistry, Histogram

from rlserve.service.engine.metrics import LATENCY_BUCKETS, FastHistogram
from rlserve.service.serve_command import serve_main


def _samples(registry_or_collector) -> dict[tuple, float]:
    metrics = registry_or_collector.collect()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in metrics for s in m.samples}


def test_fast_histogram_matches_prometheus():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.exponential(0.01, 10_000), list(LATENCY_BUCKETS), [0.0, 100.0]])
    reference = Histogram("h", "doc", ["model"], buckets=LATENCY_BUCKETS, registry=CollectorRegistry())
    fast = FastHistogram("h", "doc", ["model"], LATENCY_BUCKETS)
    for v in values:
        reference.labels("m").observe(float(v))
    child = fast.labels("m")
    for v in values[:5000]:
        child.observe(float(v))  # crosses the fold threshold once
    child.observe_many(values[5000:].tolist())
    got, want = _samples(fast), _samples(reference)
    want = {k: v for k, v in want.items() if not k[0].endswith("_created")}
    assert set(got) == set(want)
    for key, value in want.items():
        if key[0] == "h_sum":  # summed in another order: equal up to rounding
            assert abs(got[key] - value) < 1e-9 * max(1.0, value)
        else:
            assert got[key] == value, key


def test_serve_main_rejects_bad_settings(monkeypatch, capsys):
    monkeypatch.setenv("RLSERVE_MAX_BATCH_SIZE", "0")
    assert serve_main([]) == 2
    err = capsys.readouterr().err
    assert err == "rlserve serve: RLSERVE_MAX_BATCH_SIZE: expected a number >= 1, received '0'\n", err
