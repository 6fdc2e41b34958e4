"""headrace-prometheus[otel]: spans and metrics checked with the SDK's in-memory exporters."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pytest

import headrace as hr
from headrace.errors import StreamingQueryException
from headrace.plugins import register_listener, unregister_listener

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from headrace_prometheus.otel import OtelListener, listener_from_env


class Otel:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        tp = TracerProvider()
        tp.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.listener = OtelListener(tp, MeterProvider(metric_readers=[self.reader]))

    def points(self, name: str, query_id: str) -> list[Any]:
        self.listener.flush()
        data = self.reader.get_metrics_data()
        out = []
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == name:
                        # Any: the SDK types a point's attributes Optional (they are set)
                        out += [p for p in cast(Sequence[Any], m.data.data_points)
                                if p.attributes.get("headrace.query.id") == query_id]
        return out


@pytest.fixture
def otel() -> Iterator[Otel]:
    o = Otel()
    register_listener(o.listener)
    yield o
    unregister_listener(o.listener)


def test_one_span_per_batch_with_its_phases_as_children(otel: Otel, tmp_path: Path) -> None:
    q = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=100, totalRows=300).load()
         .write_stream.format("memory").query_name("otel_run").option("checkpointLocation", str(tmp_path))
         .trigger(available_now=True).start())  # fmt: skip
    assert q.await_termination(30)
    otel.listener.flush()
    # Any: the SDK types a span's attributes and times as Optional (a finished span has them all)
    # and the attribute values as a union (these are ints)
    spans: Sequence[Any] = otel.spans.get_finished_spans()
    batches = [s for s in spans if s.name == "headrace.batch" and s.attributes["headrace.query.id"] == q.id]
    assert sorted(s.attributes["headrace.batch.id"] for s in batches) == [0, 1, 2]
    for parent in batches:
        progress = q.recent_progress[parent.attributes["headrace.batch.id"]]
        assert parent.attributes["headrace.batch.input_rows"] == progress["numInputRows"] == 100
        children = sorted((s for s in spans if s.parent and s.parent.span_id == parent.context.span_id),
                          key=lambda s: s.start_time)  # fmt: skip
        assert [c.name for c in children] == ["latestOffset", "walCommit", "addBatch", "commitOffsets"]
        assert all(c.context.trace_id == parent.context.trace_id for c in children)
        for c in children:
            assert (c.end_time - c.start_time) == progress["durationMs"][c.name] * 1_000_000
            assert parent.start_time <= c.start_time and c.end_time <= parent.end_time
    (rows,) = otel.points("headrace.input_rows", q.id)
    assert rows.value == 300
    (batches_count,) = otel.points("headrace.batches", q.id)
    assert batches_count.value == 3
    add = [p for p in otel.points("headrace.batch.duration", q.id) if p.attributes["phase"] == "addBatch"]
    assert add[0].count == 3
    assert add[0].sum == pytest.approx(sum(p["durationMs"]["addBatch"] for p in q.recent_progress) / 1000)
    outstanding = [p for p in otel.points("headrace.source.metric", q.id) if p.attributes["metric"] == "numRowsOutstanding"]
    assert outstanding[0].value == 0


def test_a_failed_batch_gets_an_error_span(otel: Otel) -> None:
    def boom(t: pa.Table) -> pa.Table:
        raise ValueError("bad input")

    q = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=10, totalRows=10).load().map_batches(boom)
         .write_stream.format("memory").query_name("otel_fail").start())  # fmt: skip
    with pytest.raises(StreamingQueryException):
        q.await_termination(30)
    otel.listener.flush()
    (span,) = [s for s in cast(Sequence[Any], otel.spans.get_finished_spans())  # Any: as above
               if s.attributes.get("headrace.query.id") == q.id]
    assert span.status.status_code is StatusCode.ERROR and "bad input" in (span.status.description or "")
    assert span.attributes["headrace.batch.id"] == 0
    (failures,) = otel.points("headrace.query.failures", q.id)
    assert failures.value == 1


@pytest.mark.parametrize(
    ("env", "enabled"),
    [({}, False), ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
     ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}, False)],
    ids=["no-otel-env", "otlp-endpoint", "sdk-disabled"],
)  # fmt: skip
def test_enabled_by_the_standard_environment(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], enabled: bool) -> None:
    for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SDK_DISABLED", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
              "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):  # fmt: skip
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    listener = listener_from_env()
    assert (listener is not None) == enabled
