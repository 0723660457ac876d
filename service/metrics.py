"""Prometheus metrics, one registry per app (so several apps in one process stay apart)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from service.batcher import BatchInfo, Job

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0, 2.5)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)

SessionCounts = Callable[[], Iterable[tuple[str, str, int]]]  # (model, version, active)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.request_latency = Histogram(
            "rlserve_request_latency_seconds", "Time from request body received to response ready",
            ["model", "route"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.queue_time = Histogram(
            "rlserve_queue_time_seconds", "Time a request waited for its batch to start",
            ["model"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.batch_rows = Histogram(
            "rlserve_batch_size_rows", "Observations per runtime call",
            ["model"], buckets=_BATCH_BUCKETS, registry=self.registry)
        self.batch_requests = Histogram(
            "rlserve_batch_size_requests", "Requests per runtime call",
            ["model"], buckets=_BATCH_BUCKETS, registry=self.registry)
        self.batch_run = Histogram(
            "rlserve_batch_run_seconds", "Duration of one batch (gather, runtime, sampling, scatter)",
            ["model"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.errors = Counter(
            "rlserve_errors_total", "Error responses by code and HTTP status",
            ["code", "status"], registry=self.registry)
        self.observations = Counter(
            "rlserve_observations_total", "Observations acted on", ["model"], registry=self.registry)
        self._act_children: dict[str, object] = {}
        self._session_counts: SessionCounts = lambda: ()
        self.registry.register(_SessionCollector(lambda: self._session_counts()))

    def act_latency(self, model: str):
        """The latency histogram child of ``model``'s act route (cached: ``labels`` is slow)."""
        child = self._act_children.get(model)
        if child is None:
            child = self._act_children[model] = self.request_latency.labels(model, "act")
        return child

    def watch_sessions(self, counts: SessionCounts) -> None:
        self._session_counts = counts

    def batch_observer(self, model: str) -> Callable[[BatchInfo, Sequence[Job]], None]:
        """A ``Batcher`` observer for ``model`` with its label children bound once."""
        rows, requests = self.batch_rows.labels(model), self.batch_requests.labels(model)
        run, queue = self.batch_run.labels(model), self.queue_time.labels(model)
        observations = self.observations.labels(model)

        def observe(info: BatchInfo, jobs: Sequence[Job]) -> None:
            rows.observe(info.rows)
            requests.observe(info.requests)
            run.observe(info.run_s)
            observations.inc(info.rows)
            for job in jobs:
                queue.observe(job.queue_s)

        return observe

    def error(self, code: str, status: int) -> None:
        self.errors.labels(code, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _SessionCollector:
    """Reads the live session counts at scrape time instead of tracking every change."""

    def __init__(self, counts: SessionCounts):
        self._counts = counts

    def collect(self):
        family = GaugeMetricFamily("rlserve_active_sessions", "Live sessions per model version", labels=["model", "version"])
        for model, version, active in self._counts():
            family.add_metric([model, version], active)
        yield family

    def describe(self):
        return []
