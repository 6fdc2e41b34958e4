"""``PrometheusListener``: turns headrace's listener events into Prometheus metrics.

Every metric is labelled by ``query`` (the query name, ``""`` when unnamed) and ``query_id``
(the checkpoint's query id, stable across restarts). See the README for the full list.

The listener is a ``prometheus_client`` *custom collector*: a batch only updates plain Python
numbers (a few dictionary updates, ~5 µs on the query's thread), and the metric families are
built when the registry is collected (a scrape). ``prometheus_client`` itself is imported only
then, or when the listener is registered: the default listener joins the global ``REGISTRY``
once ``prometheus_client`` is imported by anyone (``serve()``, the application's own
``/metrics``), so a process that never exposes metrics never imports it.
"""

from __future__ import annotations

import bisect
import datetime as dt
import logging
import sys
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from headrace.plugins import hookimpl
from headrace.redaction import redact_record as redact

__all__ = ["PHASES", "PrometheusListener"]

log = logging.getLogger(__name__)

# the phases of a micro-batch, in order (Spark's durationMs keys); triggerExecution is the total
PHASES = ("latestOffset", "walCommit", "addBatch", "commitOffsets")
# seconds; from 1 ms to 5 min, for batches from tiny to large
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_Q = ("query", "query_id")

# name -> (type, help, extra labels); the families collected, in this order
_METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "batches": ("counter", "Micro-batches completed.", ()),
    "input_rows": ("counter", "Rows read from the sources.", ()),
    "output_rows": ("counter", "Rows handed to the sink.", ()),
    "input_rows_per_second": ("gauge", "Rows per second arriving, over the last trigger interval.", ()),
    "processed_rows_per_second": ("gauge", "Rows per second processed by the last batch.", ()),
    "batch_duration_seconds": ("histogram", "Time of a micro-batch by phase (latestOffset, walCommit, addBatch, "
                               "commitOffsets; triggerExecution is the whole batch).", ("phase",)),
    "last_batch_id": ("gauge", "Id of the last completed batch.", ()),
    "last_batch_input_rows": ("gauge", "Rows read by the last batch.", ()),
    "last_progress_timestamp_seconds": ("gauge", "When the last completed batch started (epoch s).", ()),
    "source_input_rows": ("counter", "Rows read, per source.", ("source",)),
    "source_metric": ("gauge", "Each numeric metric a source reports after a batch (backlog: numFilesOutstanding, "
                      "numBytesOutstanding, numRowsOutstanding, avgMsBehindLatest, ...).", ("source", "metric")),
    "sink_metric": ("gauge", "Each numeric metric the sink reports after a batch.", ("sink", "metric")),
    "realtime_latency_seconds": ("gauge", "Real-time mode latency percentiles of the last batch (kind: e2e, "
                                 "processing, sourceQueuing; quantile 0..1).", ("kind", "quantile")),
    "state_rows": ("gauge", "Rows held by a stateful operator's state store.", ("operator",)),
    "state_rows_updated": ("gauge", "State rows updated by the last batch.", ("operator",)),
    "state_memory_bytes": ("gauge", "Memory used by a stateful operator's state store.", ("operator",)),
    "state_rows_dropped_by_watermark": ("counter", "Late rows dropped by the watermark.", ("operator",)),
    "bad_records": ("counter", "Bad records by what the policy did with them (headrace.badrecords): origin "
                    "source-<i> or sink, action dropped or deadLettered.", ("origin", "action")),
    "query_active": ("gauge", "1 while the query runs, 0 after it ended.", ()),
    "query_starts": ("counter", "Times the query was started.", ()),
    "query_failures": ("counter", "Times the query ended with an error.", ()),
}  # fmt: skip


_FAST = frozenset({int, float})  # plain numbers: no isinstance chain on the per-batch path


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


class _Histogram:
    """One histogram series: a count per bucket (the last one is +Inf) and the sum."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(_BUCKETS) + 1)
        self.total = 0.0

    def observe(self, x: float) -> None:
        self.counts[bisect.bisect_left(_BUCKETS, x)] += 1
        self.total += x


class PrometheusListener:
    """A headrace listener (``headrace_query_*`` hooks) that keeps Prometheus metrics.

    ``registry``: the ``prometheus_client`` registry to register in; None (the default) means
    the global ``REGISTRY``, joined as soon as ``prometheus_client`` is imported in the process
    (checked at every event; :meth:`register` joins at once). One instance per registry.
    The hooks run on the query's thread; a batch costs a few dictionary updates, and the
    metric families are built when the registry is collected.
    """

    def __init__(self, registry: Any = None, *, namespace: str = "headrace") -> None:
        self.registry: Any = None
        self._target = registry
        self._ns = namespace
        self._lock = threading.Lock()
        self._names: dict[str, str] = {}
        self._values: dict[str, dict[tuple[str, ...], Any]] = {name: {} for name in _METRICS}
        self._descs: dict[str, str] = {}  # source description -> its label (no user:password@ of a URL)
        if registry is not None:
            self.register()

    # ------------------------------------------------------------------ registry
    def register(self) -> None:
        """Join the registry now (the global ``REGISTRY`` by default, importing
        ``prometheus_client``). Idempotent."""
        with self._lock:
            if self.registry is not None:
                return
            if self._target is None:
                from prometheus_client import REGISTRY

                self._target = REGISTRY
            self.registry = self._target
        self.registry.register(self)

    def _maybe_register(self) -> None:
        if self.registry is None and "prometheus_client" in sys.modules:
            self.register()

    def describe(self) -> list[Any]:
        """The metric families without samples (the registry checks names with it)."""
        return list(self._families(samples=False))

    def collect(self) -> Iterator[Any]:
        """The metric families with their current values; called by the registry at a scrape."""
        return iter(list(self._families(samples=True)))

    def _families(self, *, samples: bool) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
        from prometheus_client.utils import floatToGoString

        les = [floatToGoString(b) for b in _BUCKETS] + ["+Inf"]
        with self._lock:
            snapshot = {name: dict(series) for name, series in self._values.items()} if samples else {}
            hists = {k: (list(h.counts), h.total) for k, h in snapshot.get("batch_duration_seconds", {}).items()}
        for name, (kind, doc, extra) in _METRICS.items():
            full = f"{self._ns}_{name}" if self._ns else name
            labels = [*_Q, *extra]
            if kind == "counter":
                fam: Any = CounterMetricFamily(full, doc, labels=labels)
            elif kind == "gauge":
                fam = GaugeMetricFamily(full, doc, labels=labels)
            else:
                fam = HistogramMetricFamily(full, doc, labels=labels)
            if kind == "histogram":
                for key, (counts, total) in hists.items():
                    cum, buckets = 0, []
                    for le, c in zip(les, counts, strict=True):
                        cum += c
                        buckets.append((le, float(cum)))
                    fam.add_metric(list(key), buckets, total)
            else:
                for key, value in snapshot.get(name, {}).items():
                    fam.add_metric(list(key), float(value))
            yield fam

    # ------------------------------------------------------------------ hooks
    @hookimpl
    def headrace_query_started(self, event: Mapping[str, Any]) -> None:
        """Called once per query start: the query is active; its counters appear at 0."""
        self._maybe_register()
        q = self._labels(event)
        v = self._values
        with self._lock:
            v["query_active"][q] = 1.0
            v["query_starts"][q] = v["query_starts"].get(q, 0.0) + 1
            for name in ("batches", "input_rows", "output_rows", "query_failures"):
                v[name].setdefault(q, 0.0)

    @hookimpl
    def headrace_query_progress(self, progress: Mapping[str, Any]) -> None:
        """Called after every batch with its progress record."""
        if self.registry is None:
            self._maybe_register()
        try:
            with self._lock:
                self._progress(progress)
        except Exception as e:  # a listener must not fail the query
            log.warning("prometheus listener: could not record batch %s: %s", progress.get("batchId"), e)

    @hookimpl
    def headrace_query_terminated(self, event: Mapping[str, Any]) -> None:
        """Called once per query end: inactive; a failure counted."""
        self._maybe_register()
        q = self._labels(event)
        with self._lock:
            self._values["query_active"][q] = 0.0
            if event.get("exception"):
                f = self._values["query_failures"]
                f[q] = f.get(q, 0.0) + 1

    # ------------------------------------------------------------------ details
    def _labels(self, event: Mapping[str, Any]) -> tuple[str, str]:
        qid = str(event.get("id") or "")
        raw = event.get("name")
        name = self._names.get(qid, "") if raw is None else str(raw)
        if self._names.get(qid) != name:
            self._names[qid] = name
        return name, qid

    def _desc(self, desc: Any) -> str:
        label = self._descs.get(desc)
        if label is None:
            label = redact(str(desc))
            if len(self._descs) < 1024:
                self._descs[desc] = label
        return label

    def _progress(self, p: Mapping[str, Any]) -> None:
        """One record into the numbers (under the lock)."""
        v = self._values
        q = self._labels(p)
        n_in = p.get("numInputRows", 0)
        sink = p.get("sink") or {}
        batches = v["batches"]
        batches[q] = batches.get(q, 0.0) + 1
        _add(v["input_rows"], q, n_in)
        _add(v["output_rows"], q, sink.get("numOutputRows", 0))
        v["input_rows_per_second"][q] = p.get("inputRowsPerSecond", 0.0)
        v["processed_rows_per_second"][q] = p.get("processedRowsPerSecond", 0.0)
        v["last_batch_id"][q] = p.get("batchId", 0)
        v["last_batch_input_rows"][q] = n_in
        ts = p.get("timestamp")
        if isinstance(ts, str):
            v["last_progress_timestamp_seconds"][q] = dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
        hists = v["batch_duration_seconds"]
        for phase, ms in (p.get("durationMs") or {}).items():
            if (x := ms if type(ms) in _FAST else _number(ms)) is not None:
                series = (*q, phase)
                h = hists.get(series)
                if h is None:
                    h = hists[series] = _Histogram()
                h.observe(x / 1000)
        sink_metrics = sink.get("metrics") or {}
        for i, src in enumerate(p.get("sources") or ()):
            metrics = src.get("metrics") or {}
            if _has_bad(metrics, "num"):
                self._bad(q, f"source-{i}", metrics)
            desc = self._desc(src.get("description", ""))
            _add(v["source_input_rows"], (*q, desc), src.get("numInputRows", 0))
            gauges = v["source_metric"]
            for k, x in metrics.items():
                if (x := x if type(x) in _FAST else _number(x)) is not None:
                    gauges[(*q, desc, k)] = x
        if sink_metrics:
            if _has_bad(sink_metrics, "num"):
                self._bad(q, "sink", sink_metrics)
            if _has_bad(sink_metrics, "transform"):
                self._bad(q, "transform", sink_metrics, prefix="transform")
            gauges = v["sink_metric"]
            sink_desc = str(sink.get("description", ""))
            for k, x in sink_metrics.items():
                if (x := x if type(x) in _FAST else _number(x)) is not None:
                    gauges[(*q, sink_desc, k)] = x
        for kind, summary in (p.get("latencies") or {}).items():
            short = kind.removesuffix("LatencyMs")
            for pq, ms in summary.items():
                if (x := _number(ms)) is not None and pq.startswith("P"):
                    v["realtime_latency_seconds"][(*q, short, _quantile(pq))] = x / 1000
        for i, op in enumerate(p.get("stateOperators") or ()):
            op_name = f"{i}:{op.get('operatorName', 'state')}"
            for metric, key in (("state_rows", "numRowsTotal"), ("state_rows_updated", "numRowsUpdated"),
                                ("state_memory_bytes", "memoryUsedBytes")):  # fmt: skip
                if (x := _number(op.get(key))) is not None:
                    v[metric][(*q, op_name)] = x
            if (x := _number(op.get("numRowsDroppedByWatermark"))) is not None and x > 0:
                _add(v["state_rows_dropped_by_watermark"], (*q, op_name), x)

    def _bad(self, q: tuple[str, str], origin: str, metrics: Mapping[str, Any], prefix: str = "num") -> None:
        for action, n in _bad_counts(metrics, prefix):
            _add(self._values["bad_records"], (*q, origin, action), n)


def _has_bad(metrics: Mapping[str, Any], prefix: str) -> bool:
    return prefix + "BadRecordsDropped" in metrics or prefix + "BadRecordsDeadLettered" in metrics


def _add(series: dict[tuple[str, ...], Any], key: tuple[str, ...], n: Any) -> None:
    """A counter's increment (negative or non-numeric increments are ignored, as by a counter)."""
    if (type(n) not in _FAST and (isinstance(n, bool) or not isinstance(n, int | float))) or n < 0:
        return
    series[key] = series.get(key, 0.0) + n


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
