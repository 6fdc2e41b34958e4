"""OpenTelemetry export (the ``otel`` extra): metrics, and one span per batch with a child span
per phase.

Enabled by the standard environment variables: when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the
``..._TRACES_ENDPOINT`` / ``..._METRICS_ENDPOINT`` variants) is set, the plugin builds an SDK
tracer and meter provider with the OTLP exporters, which read every other ``OTEL_*`` variable
themselves (headers, protocol, timeout, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_METRIC_EXPORT_INTERVAL``...). When the application already installed SDK providers
(``opentelemetry-instrument``, or its own set-up), those are used instead. ``OTEL_SDK_DISABLED=true``,
``OTEL_TRACES_EXPORTER=none`` and ``OTEL_METRICS_EXPORTER=none`` are honoured.

Spans are made after the batch, from its progress record: ``headrace.batch`` spans the batch
(start = the batch's timestamp, length = ``batchDuration``) and its children
``latestOffset``, ``walCommit``, ``addBatch``, ``commitOffsets`` are laid back to back with their
measured lengths (the engine overlaps the write-ahead fsync with reading, so the layout is a
faithful account of each phase's length, not of its exact start).
"""

from __future__ import annotations

import atexit
import datetime as dt
import logging
import os
import queue
import threading
from collections.abc import Mapping
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.trace import Status, StatusCode

from headrace.plugins import hookimpl
from headrace.redaction import redact_record as redact
from headrace_prometheus.metrics import PHASES

__all__ = ["OtelListener", "enable", "listener_from_env"]

log = logging.getLogger(__name__)

_SCOPE = "headrace"
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")


def _ns(ts: Any) -> int | None:
    if not isinstance(ts, str):
        return None
    return int(dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1e9)


class OtelListener:
    """A headrace listener exporting OpenTelemetry metrics and spans.

    ``tracer_provider`` / ``meter_provider``: the providers to use (the global ones by default).
    Register it with ``headrace.plugins.register_listener`` (``enable()`` does), or let the
    plugin build one from the environment. Metric names: ``headrace.batches``,
    ``headrace.input_rows``, ``headrace.output_rows``, ``headrace.batch.duration`` (s, attribute
    ``phase``), ``headrace.input_rows_per_second``, ``headrace.processed_rows_per_second``,
    ``headrace.source.metric`` (attributes ``source``, ``metric``), ``headrace.realtime.latency``
    (s; ``kind``, ``quantile``), ``headrace.state.rows``, ``headrace.state.memory`` (By;
    ``operator``), ``headrace.query.failures``; each with ``headrace.query.name`` and
    ``headrace.query.id``.
    """

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        from headrace_prometheus import __version__

        # the SDK work (~0.5-1 ms a batch) happens on a worker thread, off the query's thread;
        # spans carry explicit times, so doing it a moment later changes nothing
        self._queue: queue.Queue[tuple[str, Mapping[str, Any]] | None] = queue.Queue(maxsize=10_000)
        self._worker = threading.Thread(target=self._work, name="headrace-otel", daemon=True)
        self._worker.start()
        atexit.register(self.flush)

        tp = tracer_provider or trace.get_tracer_provider()
        mp = meter_provider or metrics.get_meter_provider()
        self.tracer = tp.get_tracer(_SCOPE, __version__)
        m = mp.get_meter(_SCOPE, __version__)
        self.batches = m.create_counter("headrace.batches", unit="{batch}", description="Micro-batches completed.")
        self.input_rows = m.create_counter("headrace.input_rows", unit="{row}", description="Rows read.")
        self.output_rows = m.create_counter("headrace.output_rows", unit="{row}", description="Rows handed to the sink.")
        self.duration = m.create_histogram("headrace.batch.duration", unit="s", description="Batch time by phase.")
        self.input_rate = m.create_gauge("headrace.input_rows_per_second", unit="{row}/s")
        self.processing_rate = m.create_gauge("headrace.processed_rows_per_second", unit="{row}/s")
        self.source_metric = m.create_gauge("headrace.source.metric", description="A source's numeric metrics.")
        self.latency = m.create_gauge("headrace.realtime.latency", unit="s", description="Real-time latency percentiles.")
        self.state_rows = m.create_gauge("headrace.state.rows", unit="{row}")
        self.state_memory = m.create_gauge("headrace.state.memory", unit="By")
        self.failures = m.create_counter("headrace.query.failures", description="Queries ended by an error.")

    @staticmethod
    def _attrs(p: Mapping[str, Any]) -> dict[str, str]:
        return {"headrace.query.name": str(p.get("name") or ""), "headrace.query.id": str(p.get("id") or "")}

    @hookimpl
    def headrace_query_started(self, event: Mapping[str, Any]) -> None:
        """Nothing to export at start (spans are per batch)."""

    @hookimpl
    def headrace_query_progress(self, progress: Mapping[str, Any]) -> None:
        """Called after every batch: queues its metrics and spans for the worker thread."""
        self._put(("progress", progress))

    @hookimpl
    def headrace_query_terminated(self, event: Mapping[str, Any]) -> None:
        """A failure: counted, and an error span ``headrace.batch`` for the batch that failed."""
        if event.get("exception"):
            self._put(("failure", event))

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until every queued event was handed to the SDK (tests, and at exit)."""
        done = threading.Event()
        self._put(("flush", {"event": done}))
        done.wait(timeout)

    def _put(self, item: tuple[str, Mapping[str, Any]]) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:  # the exporter is stuck: drop telemetry rather than slow the query
            log.warning("OpenTelemetry listener: queue full, dropping a %s event", item[0])

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            kind, payload = item
            try:
                if kind == "progress":
                    self._metrics(payload)
                    self._spans(payload)
                elif kind == "failure":
                    self._failure(payload)
                else:
                    payload["event"].set()
            except Exception as e:  # telemetry must not kill its worker
                log.warning("OpenTelemetry listener: could not export %s: %s", kind, e)

    def _failure(self, event: Mapping[str, Any]) -> None:
        attrs = self._attrs(event)
        self.failures.add(1, attrs)
        span = self.tracer.start_span("headrace.batch", attributes={
            **attrs, "headrace.run.id": str(event.get("runId") or ""),
            "headrace.batch.id": -1 if event.get("failedBatchId") is None else int(event["failedBatchId"])})  # fmt: skip
        span.set_status(Status(StatusCode.ERROR, str(event["exception"])[:1000]))
        span.end()

    def _metrics(self, p: Mapping[str, Any]) -> None:
        attrs = self._attrs(p)
        self.batches.add(1, attrs)
        self.input_rows.add(int(p.get("numInputRows", 0)), attrs)
        sink = p.get("sink") or {}
        self.output_rows.add(int(sink.get("numOutputRows", 0)), attrs)
        self.input_rate.set(float(p.get("inputRowsPerSecond", 0.0)), attrs)
        self.processing_rate.set(float(p.get("processedRowsPerSecond", 0.0)), attrs)
        for phase, ms in (p.get("durationMs") or {}).items():
            self.duration.record(ms / 1000, {**attrs, "phase": phase})
        for src in p.get("sources") or ():
            for k, v in (src.get("metrics") or {}).items():
                if isinstance(v, int | float) and not isinstance(v, bool):
                    self.source_metric.set(v, {**attrs, "source": redact(str(src.get("description", ""))), "metric": k})
        for kind, summary in (p.get("latencies") or {}).items():
            for q, ms in summary.items():
                self.latency.set(ms / 1000, {**attrs, "kind": kind.removesuffix("LatencyMs"),
                                              "quantile": format(int(q[1:]) / 100, "g")})  # fmt: skip
        for i, op in enumerate(p.get("stateOperators") or ()):
            a = {**attrs, "operator": f"{i}:{op.get('operatorName', 'state')}"}
            if isinstance(op.get("numRowsTotal"), int | float):
                self.state_rows.set(op["numRowsTotal"], a)
            if isinstance(op.get("memoryUsedBytes"), int | float):
                self.state_memory.set(op["memoryUsedBytes"], a)

    def _spans(self, p: Mapping[str, Any]) -> None:
        start = _ns(p.get("timestamp"))
        if start is None:
            return
        durations = p.get("durationMs") or {}
        total = int(p.get("batchDuration") or durations.get("triggerExecution", 0))
        attrs: dict[str, Any] = {**self._attrs(p), "headrace.run.id": str(p.get("runId") or ""),
                                 "headrace.batch.id": int(p.get("batchId", -1)),
                                 "headrace.batch.input_rows": int(p.get("numInputRows", 0)),
                                 "headrace.batch.output_rows": int((p.get("sink") or {}).get("numOutputRows", 0))}  # fmt: skip
        parent = self.tracer.start_span("headrace.batch", start_time=start, attributes=attrs)
        ctx = trace.set_span_in_context(parent)
        cursor = start
        for phase in PHASES:
            if phase not in durations:
                continue
            length = int(durations[phase] * 1_000_000)
            child = self.tracer.start_span(phase, context=ctx, start_time=cursor,
                                           attributes={"headrace.phase": phase})  # fmt: skip
            child.end(end_time=cursor + length)
            cursor += length
        parent.end(end_time=max(start + total * 1_000_000, cursor))


def enable(tracer_provider: Any = None, meter_provider: Any = None) -> OtelListener:
    """Register an ``OtelListener`` for every query of this process; returns it."""
    from headrace.plugins import register_listener

    listener = OtelListener(tracer_provider, meter_provider)
    register_listener(listener)
    return listener


def _sdk_installed(provider: Any, sdk_class: type) -> bool:
    return isinstance(provider, sdk_class)


def listener_from_env() -> OtelListener | None:
    """The listener the plugin uses: built from the ``OTEL_*`` variables, or None when they do
    not ask for OpenTelemetry (and the application installed no SDK provider)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    global_tp, global_mp = trace.get_tracer_provider(), metrics.get_meter_provider()
    if _sdk_installed(global_tp, TracerProvider) or _sdk_installed(global_mp, MeterProvider):
        return OtelListener(global_tp, global_mp)
    if not any(os.environ.get(v) for v in _ENDPOINTS):
        return None
    from opentelemetry.sdk.resources import Resource

    given = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    resource = Resource.create({} if given else {"service.name": "headrace"})
    tp: Any = trace.NoOpTracerProvider()
    mp: Any = metrics.NoOpMeterProvider()
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() != "none":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        tp = TracerProvider(resource=resource)
        tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if os.environ.get("OTEL_METRICS_EXPORTER", "otlp").strip().lower() != "none":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        mp = MeterProvider(resource=resource, metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())])
    log.info("exporting OpenTelemetry spans and metrics over OTLP/HTTP")
    return OtelListener(tp, mp)
