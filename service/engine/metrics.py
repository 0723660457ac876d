"""Prometheus metrics, one registry per app (so several apps in one process stay apart).

The per-request histograms (request latency, queue time) sit on the hot path, where
``prometheus_client.Histogram.observe`` (a Python loop over the buckets, ~1.5 us) would
cost more than parsing the request. ``FastHistogram`` appends to a list instead and folds
the values into bucket counts with numpy once per 4096 observations or at scrape time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence

import numpy as np
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from rlserve.service.engine.batcher import BatchInfo, Job

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
STORE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.5, 2.0)

# (model, version, value) per loaded model version, read at scrape time.
VersionCounts = Callable[[], Iterable[tuple[str, str, int]]]
# (kind, open connections) per kind of stream (stream, openpi, agents), read at scrape time.
StreamCounts = Callable[[], Iterable[tuple[str, int]]]
# (live model, live version, candidate, {outcome: rows}, queue depth) per shadow, read at scrape time.
ShadowStats = Callable[[], Iterable[tuple[str, str, str, dict[str, int], int]]]


class FastHistogram:
    """A labelled histogram whose ``observe`` is a list append (folded lazily)."""

    FOLD_AT = 4096

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]):
        self.name, self.documentation = name, documentation
        self.labelnames = list(labelnames)
        self.bounds = np.asarray(buckets, dtype=np.float64)
        self._children: dict[tuple[str, ...], _Child] = {}
        self._lock = threading.Lock()

    def labels(self, *values: str) -> _Child:
        child = self._children.get(values)
        if child is None:
            with self._lock:
                child = self._children.setdefault(values, _Child(self.bounds))
        return child

    def collect(self):
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self._children.items()):
            counts, total = child.snapshot()
            cumulative = np.cumsum(counts)
            buckets = [(_le(b), float(c)) for b, c in zip(self.bounds, cumulative[:-1], strict=True)]
            buckets.append(("+Inf", float(cumulative[-1])))
            family.add_metric(list(values), buckets, total)
        yield family

    def describe(self):
        return []


class _Child:
    def __init__(self, bounds: np.ndarray):
        self._bounds = bounds
        self._pending: list[float] = []
        self._counts = np.zeros(len(bounds) + 1, dtype=np.int64)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        pending = self._pending
        pending.append(value)
        if len(pending) >= FastHistogram.FOLD_AT:
            self._fold()

    def observe_many(self, values: Sequence[float]) -> None:
        self._pending.extend(values)
        if len(self._pending) >= FastHistogram.FOLD_AT:
            self._fold()

    def _fold(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
            if pending:
                arr = np.asarray(pending, dtype=np.float64)
                # Prometheus buckets are "<= le": the first bound >= value.
                self._counts += np.bincount(np.searchsorted(self._bounds, arr, side="left"),
                                            minlength=len(self._counts))
                self._sum += float(arr.sum())

    def snapshot(self) -> tuple[np.ndarray, float]:
        self._fold()
        return self._counts.copy(), self._sum


def _le(bound: float) -> str:
    return repr(float(bound))


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.request_latency = self._histogram(
            "rlserve_request_latency_seconds", "Time from request body received to response ready",
            ["model", "route"], LATENCY_BUCKETS)
        self.queue_time = self._histogram(
            "rlserve_queue_time_seconds", "Time a request waited for its batch to start", ["model"], LATENCY_BUCKETS)
        self.batch_rows = self._histogram(
            "rlserve_batch_size_rows", "Observations per runtime call", ["model"], BATCH_BUCKETS)
        self.batch_requests = self._histogram(
            "rlserve_batch_size_requests", "Requests per runtime call", ["model"], BATCH_BUCKETS)
        self.batch_run = self._histogram(
            "rlserve_batch_run_seconds", "Duration of one batch (gather, runtime, sampling, scatter)",
            ["model"], LATENCY_BUCKETS)
        self.errors = Counter(
            "rlserve_errors_total", "Error responses by code and HTTP status",
            ["code", "status"], registry=self.registry)
        self.observations = Counter(
            "rlserve_observations_total", "Observations acted on", ["model"], registry=self.registry)
        # The external session store (rlserve.service.sessions.redis_store reports these).
        self.store_latency = self._histogram(
            "rlserve_session_store_seconds", "Round trips to the external session store, by operation "
            "(validate and commit: one per batch; load: one per request that missed)", ["op"], STORE_BUCKETS)
        self.session_cache_total = Counter(
            "rlserve_session_cache_total", "Session steps served from this process's copy (hit) or read "
            "from the external store first (miss: a restart, a failover, another replica stepped it)",
            ["result"], registry=self.registry)
        self.session_conflicts_total = Counter(
            "rlserve_session_conflicts_total", "Requests refused with 409 because their sessions changed "
            "elsewhere while they ran (the compare-and-set write lost)", registry=self.registry)
        # The experience log (rlserve.service.experience reports these, from its writer thread too).
        self.experience_rows_total = Counter(
            "rlserve_experience_rows_total", "Rows the experience log wrote, by form (columns: transitions, "
            "episodes: episode segments, rewards: delayed rewards)", ["form"], registry=self.registry)
        self.experience_dropped_total = Counter(
            "rlserve_experience_dropped_total", "Rows the experience log dropped instead of slowing or failing "
            "a request (queue_full: the writer fell behind; write_failed: the disk refused the file)",
            ["reason"], registry=self.registry)
        self.experience_unfinished_total = Counter(
            "rlserve_experience_unfinished_total", "Logged episodes restarted before the client sent their last "
            "observation (terminated or truncated): their last step is not in the log", registry=self.registry)
        self.experience_rewards_unmatched_total = Counter(
            "rlserve_experience_rewards_unmatched_total", "Delayed rewards taken for event ids that no answer can "
            "have carried (not an event id, or one of this process's own not given yet): they join no step. "
            "Ids of other processes are not known here; `rlserve experience summary` counts every reward "
            "that matched nothing", registry=self.registry)
        self._cache_hit = self.session_cache_total.labels("hit")
        self._cache_miss = self.session_cache_total.labels("miss")
        self._route_children: dict[tuple[str, str], _Child] = {}
        self._session_counts: VersionCounts = lambda: ()
        self._queued_rows: VersionCounts = lambda: ()
        self.registry.register(_VersionGauge("rlserve_active_sessions", "Live sessions per model version",
                                             lambda: self._session_counts()))
        # What an autoscaler reads as load (docker/kubernetes/overlays/queue-hpa): rows accepted
        # but not yet in a batch; it grows only when the runtime cannot keep up.
        self._stream_counts: StreamCounts = lambda: ()
        self.registry.register(_StreamsGauge(lambda: self._stream_counts()))
        self._shadow_stats: ShadowStats = lambda: ()
        self.registry.register(_ShadowCollector(lambda: self._shadow_stats()))
        self.registry.register(_VersionGauge(
            "rlserve_queued_rows", "Observations waiting in the batcher's queue per model version",
            lambda: self._queued_rows()))

    def _histogram(self, name: str, doc: str, labels: list[str], buckets: Sequence[float]) -> FastHistogram:
        histogram = FastHistogram(name, doc, labels, buckets)
        self.registry.register(histogram)
        return histogram

    def route_latency(self, model: str, route: str) -> _Child:
        """The latency histogram child of ``model`` on ``route`` (``act``, ``infer``), cached
        so the hot path skips prometheus' label lookup."""
        key = (model, route)
        child = self._route_children.get(key)
        if child is None:
            child = self._route_children[key] = self.request_latency.labels(model, route)
        return child

    def watch_sessions(self, counts: VersionCounts) -> None:
        self._session_counts = counts

    def watch_queues(self, rows: VersionCounts) -> None:
        self._queued_rows = rows

    def watch_shadows(self, stats: ShadowStats) -> None:
        self._shadow_stats = stats

    def watch_streams(self, counts: StreamCounts) -> None:
        self._stream_counts = counts

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
            queue.observe_many([job.queue_s for job in jobs])

        return observe

    def store_call(self, op: str, seconds: float) -> None:
        self.store_latency.labels(op).observe(seconds)

    def session_cache(self, hits: int, misses: int) -> None:
        if hits:
            self._cache_hit.inc(hits)
        if misses:
            self._cache_miss.inc(misses)

    def session_conflicts(self, count: int) -> None:
        self.session_conflicts_total.inc(count)

    def experience_written(self, form: str, count: int) -> None:
        self.experience_rows_total.labels(form).inc(count)

    def experience_dropped(self, reason: str, count: int) -> None:
        self.experience_dropped_total.labels(reason).inc(count)

    def experience_unfinished(self, count: int) -> None:
        self.experience_unfinished_total.inc(count)

    def experience_rewards_unmatched(self, count: int) -> None:
        self.experience_rewards_unmatched_total.inc(count)

    def error(self, code: str, status: int) -> None:
        self.errors.labels(code, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _VersionGauge:
    """A gauge per model version read at scrape time instead of tracking every change."""

    def __init__(self, name: str, documentation: str, counts: VersionCounts):
        self._name, self._documentation, self._counts = name, documentation, counts

    def collect(self):
        family = GaugeMetricFamily(self._name, self._documentation, labels=["model", "version"])
        for model, version, value in self._counts():
            family.add_metric([model, version], value)
        yield family

    def describe(self):
        return []


class _StreamsGauge:
    """The open WebSocket streams by kind (``rlserve.service.stream.route``), read at scrape time."""

    def __init__(self, counts: StreamCounts):
        self._counts = counts

    def collect(self):
        family = GaugeMetricFamily("rlserve_streams_open", "Open WebSocket streams by kind (stream: a model's "
                                   "session, openpi: openpi's protocol, agents: a policy set's episode)",
                                   labels=["kind"])
        for kind, value in self._counts():
            family.add_metric([kind], value)
        yield family

    def describe(self):
        return []


class _ShadowCollector:
    """The shadows' counts (``rlserve.service.shadow``), read from them at scrape time: the
    live path and the candidate's process only add to plain integers."""

    def __init__(self, stats: ShadowStats):
        self._stats = stats

    def collect(self):
        rows = CounterMetricFamily(
            "rlserve_shadow_rows", "Live rows a shadow candidate was offered, by outcome (scored: run; dropped: "
            "its queue was full or it stopped; skipped_broken: a later row of a session broken by a drop, skipped "
            "until its next episode; skipped_not_admitted: a row of an episode that started while the "
            "queue was above its admission mark; failed: a candidate batch raised; unwritten: scores the "
            "experience log's queue refused)", labels=["model", "version", "candidate", "outcome"])
        depth = GaugeMetricFamily("rlserve_shadow_queue_rows", "Rows waiting for a shadow candidate",
                                  labels=["model", "version", "candidate"])
        failures = CounterMetricFamily(
            "rlserve_shadow_store_failures", "Reads and writes of a shadow's state in the external session store "
            "that failed (the shadow goes on with the state it holds)", labels=["model", "version", "candidate"])
        for model, version, candidate, counts, queued in self._stats():
            for outcome, value in counts.items():
                if outcome == "store_failures":
                    failures.add_metric([model, version, candidate], value)
                else:
                    rows.add_metric([model, version, candidate, outcome], value)
            depth.add_metric([model, version, candidate], queued)
        yield rows
        yield depth
        yield failures

    def describe(self):
        return []
