"""``PrometheusListener``: turns headrace's listener events into Prometheus metrics.

Every metric is labelled by ``query`` (the query name, ``""`` when unnamed) and ``query_id``
(the checkpoint's query id, stable across restarts). See the README for the full list.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from headrace.history import redact
from headrace.plugins import hookimpl

__all__ = ["PHASES", "PrometheusListener"]

log = logging.getLogger(__name__)

# the phases of a micro-batch, in order (Spark's durationMs keys); triggerExecution is the total
PHASES = ("latestOffset", "walCommit", "addBatch", "commitOffsets")
# seconds; from 1 ms to 5 min, for batches from tiny to large
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_Q = ("query", "query_id")


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


class PrometheusListener:
    """A headrace listener (``headrace_query_*`` hooks) that updates Prometheus metrics.

    ``registry``: the ``prometheus_client`` registry to register the metrics in (the global
    ``REGISTRY`` by default, so an application's own ``/metrics`` endpoint shows them too).
    One instance per registry. The hooks run on the query's thread; each takes a few
    microseconds per source and phase.
    """

    def __init__(self, registry: CollectorRegistry | None = None, *, namespace: str = "headrace") -> None:
        self.registry = REGISTRY if registry is None else registry
        r, ns = self.registry, namespace
        self._lock = threading.Lock()
        self.batches = Counter("batches", "Micro-batches completed.", _Q, namespace=ns, registry=r)
        self.input_rows = Counter("input_rows", "Rows read from the sources.", _Q, namespace=ns, registry=r)
        self.output_rows = Counter("output_rows", "Rows handed to the sink.", _Q, namespace=ns, registry=r)
        self.input_rate = Gauge("input_rows_per_second", "Rows per second arriving, over the last trigger interval.",
                                _Q, namespace=ns, registry=r)  # fmt: skip
        self.processing_rate = Gauge("processed_rows_per_second", "Rows per second processed by the last batch.",
                                     _Q, namespace=ns, registry=r)  # fmt: skip
        self.batch_duration = Histogram(
            "batch_duration_seconds", "Time of a micro-batch by phase (latestOffset, walCommit, addBatch, "
            "commitOffsets; triggerExecution is the whole batch).", (*_Q, "phase"), namespace=ns, registry=r,
            buckets=_BUCKETS,
        )  # fmt: skip
        self.last_batch_id = Gauge("last_batch_id", "Id of the last completed batch.", _Q, namespace=ns, registry=r)
        self.last_batch_rows = Gauge("last_batch_input_rows", "Rows read by the last batch.", _Q, namespace=ns, registry=r)
        self.last_progress = Gauge("last_progress_timestamp_seconds", "When the last completed batch started (epoch s).",
                                   _Q, namespace=ns, registry=r)  # fmt: skip
        self.source_rows = Counter("source_input_rows", "Rows read, per source.", (*_Q, "source"), namespace=ns, registry=r)
        self.source_metric = Gauge(
            "source_metric", "Each numeric metric a source reports after a batch (backlog: numFilesOutstanding, "
            "numBytesOutstanding, numRowsOutstanding, avgMsBehindLatest, ...).", (*_Q, "source", "metric"),
            namespace=ns, registry=r,
        )  # fmt: skip
        self.sink_metric = Gauge("sink_metric", "Each numeric metric the sink reports after a batch.",
                                 (*_Q, "sink", "metric"), namespace=ns, registry=r)  # fmt: skip
        self.latency = Gauge(
            "realtime_latency_seconds", "Real-time mode latency percentiles of the last batch (kind: e2e, "
            "processing, sourceQueuing; quantile 0..1).", (*_Q, "kind", "quantile"), namespace=ns, registry=r,
        )  # fmt: skip
        self.state_rows = Gauge("state_rows", "Rows held by a stateful operator's state store.",
                                (*_Q, "operator"), namespace=ns, registry=r)  # fmt: skip
        self.state_rows_updated = Gauge("state_rows_updated", "State rows updated by the last batch.",
                                        (*_Q, "operator"), namespace=ns, registry=r)  # fmt: skip
        self.state_memory = Gauge("state_memory_bytes", "Memory used by a stateful operator's state store.",
                                  (*_Q, "operator"), namespace=ns, registry=r)  # fmt: skip
        self.state_dropped = Counter("state_rows_dropped_by_watermark", "Late rows dropped by the watermark.",
                                     (*_Q, "operator"), namespace=ns, registry=r)  # fmt: skip
        self.bad_records = Counter(
            "bad_records", "Bad records by what the policy did with them (headrace.badrecords): origin source-<i> "
            "or sink, action dropped or deadLettered.", (*_Q, "origin", "action"), namespace=ns, registry=r,
        )  # fmt: skip
        self.active = Gauge("query_active", "1 while the query runs, 0 after it ended.", _Q, namespace=ns, registry=r)
        self.starts = Counter("query_starts", "Times the query was started.", _Q, namespace=ns, registry=r)
        self.failures = Counter("query_failures", "Times the query ended with an error.", _Q, namespace=ns, registry=r)
        self._names: dict[str, str] = {}
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    # ------------------------------------------------------------------ hooks
    @hookimpl
    def headrace_query_started(self, event: Mapping[str, Any]) -> None:
        """Called once per query start: the query is active; its counters appear at 0."""
        q = self._labels(event)
        self.active.labels(*q).set(1)
        self.starts.labels(*q).inc()
        for c in (self.batches, self.input_rows, self.output_rows, self.failures):
            c.labels(*q)

    @hookimpl
    def headrace_query_progress(self, progress: Mapping[str, Any]) -> None:
        """Called after every batch with its progress record."""
        try:
            self._progress(progress)
        except Exception as e:  # a listener must not fail the query
            log.warning("prometheus listener: could not record batch %s: %s", progress.get("batchId"), e)

    @hookimpl
    def headrace_query_terminated(self, event: Mapping[str, Any]) -> None:
        """Called once per query end: inactive; a failure counted."""
        q = self._labels(event)
        self.active.labels(*q).set(0)
        if event.get("exception"):
            self.failures.labels(*q).inc()

    # ------------------------------------------------------------------ details
    def _labels(self, event: Mapping[str, Any]) -> tuple[str, str]:
        qid = str(event.get("id") or "")
        with self._lock:
            name = event.get("name")
            if name is None:
                name = self._names.get(qid, "")
            self._names[qid] = str(name)
        return str(name), qid

    def _bad(self, q: tuple[str, str], origin: str, metrics: Mapping[str, Any], prefix: str = "num") -> None:
        for action, n in _bad_counts(metrics, prefix):
            self._child(self.bad_records, *q, origin, action).inc(n)

    def _child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, cached: the label sets of a query repeat every batch."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def _progress(self, p: Mapping[str, Any]) -> None:
        q = self._labels(p)
        self._child(self.batches, *q).inc()
        self._child(self.input_rows, *q).inc(p.get("numInputRows", 0))
        sink = p.get("sink") or {}
        self._child(self.output_rows, *q).inc(sink.get("numOutputRows", 0))
        self._child(self.input_rate, *q).set(p.get("inputRowsPerSecond", 0.0))
        self._child(self.processing_rate, *q).set(p.get("processedRowsPerSecond", 0.0))
        self._child(self.last_batch_id, *q).set(p.get("batchId", 0))
        self._child(self.last_batch_rows, *q).set(p.get("numInputRows", 0))
        ts = p.get("timestamp")
        if isinstance(ts, str):
            import datetime as dt

            self._child(self.last_progress, *q).set(dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp())
        for phase, ms in (p.get("durationMs") or {}).items():
            if _number(ms) is not None:
                self._child(self.batch_duration, *q, phase).observe(ms / 1000)
        for i, src in enumerate(p.get("sources") or ()):
            self._bad(q, f"source-{i}", src.get("metrics") or {})
        self._bad(q, "sink", sink.get("metrics") or {})
        self._bad(q, "transform", sink.get("metrics") or {}, prefix="transform")
        for src in p.get("sources") or ():
            desc = redact(str(src.get("description", "")))  # no user:password@ of a URL in a label
            self._child(self.source_rows, *q, desc).inc(src.get("numInputRows", 0))
            for k, v in (src.get("metrics") or {}).items():
                if (x := _number(v)) is not None:
                    self._child(self.source_metric, *q, desc, k).set(x)
        for k, v in (sink.get("metrics") or {}).items():
            if (x := _number(v)) is not None:
                self._child(self.sink_metric, *q, str(sink.get("description", "")), k).set(x)
        for kind, summary in (p.get("latencies") or {}).items():
            short = kind.removesuffix("LatencyMs")
            for pq, ms in summary.items():
                if (x := _number(ms)) is not None and pq.startswith("P"):
                    self._child(self.latency, *q, short, _quantile(pq)).set(x / 1000)
        for i, op in enumerate(p.get("stateOperators") or ()):
            name = f"{i}:{op.get('operatorName', 'state')}"
            for gauge, key in ((self.state_rows, "numRowsTotal"), (self.state_rows_updated, "numRowsUpdated"),
                               (self.state_memory, "memoryUsedBytes")):  # fmt: skip
                if (x := _number(op.get(key))) is not None:
                    self._child(gauge, *q, name).set(x)
            if (x := _number(op.get("numRowsDroppedByWatermark"))) is not None and x > 0:
                self._child(self.state_dropped, *q, name).inc(x)


def _bad_counts(metrics: Mapping[str, Any], prefix: str = "num") -> list[tuple[str, float]]:
    out = []
    for action, key in (("dropped", "BadRecordsDropped"), ("deadLettered", "BadRecordsDeadLettered")):
        x = _number(metrics.get(prefix + key))
        if x:
            out.append((action, x))
    return out


def _quantile(p: str) -> str:
    """``"P99"`` -> ``"0.99"``, ``"P100"`` -> ``"1"``, ``"P0"`` -> ``"0"``."""
    return format(int(p[1:]) / 100, "g")
