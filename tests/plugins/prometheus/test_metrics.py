"""headrace-prometheus: the /metrics endpoint scraped over HTTP and parsed while queries run."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import headrace as hr
from headrace.errors import StreamingQueryException
from headrace.testing import wait_for
from headrace_prometheus import PrometheusListener, serve
from headrace_prometheus.server import MetricsServer


@pytest.fixture(scope="module")
def server() -> Iterator[MetricsServer]:
    s = serve(0)
    yield s
    s.close()


def scrape(server: MetricsServer, query_id: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of one query: {(sample name, labels without query/query_id): value}."""
    with urllib.request.urlopen(server.url, timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("query_id") == query_id:
                labels = frozenset((k, v) for k, v in s.labels.items() if k not in ("query", "query_id"))
                out[(s.name, labels)] = s.value
    return out


def L(**kw: str) -> frozenset[tuple[str, str]]:
    return frozenset(kw.items())


def test_scraped_metrics_match_the_progress_records_while_the_query_runs(server: MetricsServer, tmp_path: Path) -> None:
    q = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=100, totalRows=500).load()
         .map_batches(lambda t: t.filter(pc.less(t["value"], 450)))
         .write_stream.format("memory").query_name("prom_run").option("checkpointLocation", str(tmp_path))
         .trigger(processing_time="20 milliseconds").start())  # fmt: skip
    try:
        wait_for(lambda: len(q.recent_progress) == 5, what="5 batches")
        assert q.is_active
        m = scrape(server, q.id)
        progress = q.recent_progress
        assert m[("headrace_query_active", L())] == 1
        assert m[("headrace_batches_total", L())] == 5
        assert m[("headrace_input_rows_total", L())] == sum(p["numInputRows"] for p in progress) == 500
        assert m[("headrace_output_rows_total", L())] == sum(p["sink"]["numOutputRows"] for p in progress) == 450
        assert m[("headrace_last_batch_id", L())] == 4
        assert m[("headrace_input_rows_per_second", L())] == progress[-1]["inputRowsPerSecond"]
        assert m[("headrace_processed_rows_per_second", L())] == progress[-1]["processedRowsPerSecond"]
        for phase in ("latestOffset", "walCommit", "addBatch", "commitOffsets", "triggerExecution"):
            assert m[("headrace_batch_duration_seconds_count", L(phase=phase))] == 5
            expected = sum(p["durationMs"][phase] for p in progress) / 1000
            assert m[("headrace_batch_duration_seconds_sum", L(phase=phase))] == pytest.approx(expected)
        src = progress[-1]["sources"][0]["description"]
        assert m[("headrace_source_metric", L(source=src, metric="numRowsOutstanding"))] == 0
        assert m[("headrace_source_input_rows_total", L(source=src))] == 500
        assert m[("headrace_query_failures_total", L())] == 0
    finally:
        q.stop()
    m = scrape(server, q.id)
    assert m[("headrace_query_active", L())] == 0


def test_a_failed_query_is_counted(server: MetricsServer) -> None:
    def boom(t: pa.Table) -> pa.Table:
        raise ValueError("no")

    q = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=10, totalRows=10).load().map_batches(boom)
         .write_stream.format("memory").query_name("prom_fail").start())  # fmt: skip
    with pytest.raises(StreamingQueryException):
        q.await_termination(30)
    m = scrape(server, q.id)
    assert m[("headrace_query_failures_total", L())] == 1
    assert m[("headrace_query_active", L())] == 0
    assert m[("headrace_batches_total", L())] == 0


def test_real_time_latency_percentiles(server: MetricsServer, tmp_path: Path) -> None:
    q = (hr.read_stream.format("rate").option("rowsPerSecond", 200).load().write_stream.format("memory")
         .query_name("prom_rt").option("checkpointLocation", str(tmp_path)).trigger(real_time="1 second").start())  # fmt: skip
    wait_for(lambda: q.recent_progress, what="a real-time batch")
    q.stop()
    last = q.last_progress
    assert last is not None
    m = scrape(server, q.id)
    for kind in ("e2e", "processing", "sourceQueuing"):
        for p, quantile in (("P50", "0.5"), ("P99", "0.99"), ("P100", "1")):
            got = m[("headrace_realtime_latency_seconds", L(kind=kind, quantile=quantile))]
            assert got == pytest.approx(last["latencies"][f"{kind}LatencyMs"][p] / 1000)


def test_state_operators_and_sink_metrics_from_a_progress_record() -> None:
    registry = CollectorRegistry()
    lst = PrometheusListener(registry)
    record: dict[str, Any] = {
        "id": "qid", "name": "agg", "batchId": 7, "numInputRows": 3, "timestamp": "2026-01-01T00:00:00.000Z",
        "durationMs": {"addBatch": 5}, "sources": [],
        "sink": {"description": "delta", "numOutputRows": 2, "metrics": {"numFiles": 1, "note": "x"}},
        "stateOperators": [{"operatorName": "aggregate", "numRowsTotal": 42, "numRowsUpdated": 3,
                            "memoryUsedBytes": 4096, "numRowsDroppedByWatermark": 2}],
    }  # fmt: skip
    lst.headrace_query_started(event={"id": "qid", "name": "agg"})
    lst.headrace_query_progress(progress=record)
    labels = {"query": "agg", "query_id": "qid"}
    op = {**labels, "operator": "0:aggregate"}
    assert registry.get_sample_value("headrace_state_rows", op) == 42
    assert registry.get_sample_value("headrace_state_rows_updated", op) == 3
    assert registry.get_sample_value("headrace_state_memory_bytes", op) == 4096
    assert registry.get_sample_value("headrace_state_rows_dropped_by_watermark_total", op) == 2
    assert registry.get_sample_value("headrace_sink_metric", {**labels, "sink": "delta", "metric": "numFiles"}) == 1
    assert registry.get_sample_value("headrace_last_progress_timestamp_seconds", labels) == 1767225600.0


def test_bad_records_are_counted_by_origin_and_action() -> None:
    registry = CollectorRegistry()
    lst = PrometheusListener(registry)
    for b in range(2):
        lst.headrace_query_progress(progress={
            "id": "qid", "name": "bad", "batchId": b, "numInputRows": 10, "durationMs": {},
            "sources": [{"description": "cloudFiles", "numInputRows": 10,
                         "metrics": {"numBadRecords": 3, "numBadRecordsDropped": 0, "numBadRecordsDeadLettered": 3}}],
            "sink": {"description": "lakebase", "numOutputRows": 10,
                     "metrics": {"numBadRecords": 1, "numBadRecordsDropped": 1, "numBadRecordsDeadLettered": 0}},
        })  # fmt: skip
    labels = {"query": "bad", "query_id": "qid"}
    assert registry.get_sample_value("headrace_bad_records_total", {**labels, "origin": "source-0", "action": "deadLettered"}) == 6
    assert registry.get_sample_value("headrace_bad_records_total", {**labels, "origin": "sink", "action": "dropped"}) == 2
    assert registry.get_sample_value("headrace_bad_records_total", {**labels, "origin": "sink", "action": "deadLettered"}) is None


def test_port_in_use_is_a_clear_error(server: MetricsServer) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(OSError, match="cannot serve metrics on 127.0.0.1:.*give another port"):
            serve(s.getsockname()[1])


def test_prometheus_client_is_imported_only_when_metrics_are_exposed(tmp_path: Path) -> None:
    """A process that never exposes metrics never imports prometheus_client; one that imports it
    later (its own /metrics on the global REGISTRY) sees every batch, those before included."""
    import os
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(f"""
        import sys
        import headrace as hr

        def run(name, rows):
            q = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=10, totalRows=rows).load()
                 .write_stream.format("noop").query_name(name).option("checkpointLocation", {str(tmp_path)!r} + "/" + name)
                 .trigger(available_now=True).start())
            q.await_termination()
            return q.id

        first = run("lazy_a", 30)
        assert "prometheus_client" not in sys.modules, "imported at query start"
        from prometheus_client import REGISTRY
        second = run("lazy_b", 20)
        for name, qid, batches in (("lazy_a", first, 3), ("lazy_b", second, 2)):
            got = REGISTRY.get_sample_value("headrace_batches_total", {{"query": name, "query_id": qid}})
            assert got == batches, (name, got)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "HEADRACE_METRICS_PORT"})  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_batch_duration_buckets_are_cumulative_and_counters_only_grow() -> None:
    registry = CollectorRegistry()
    lst = PrometheusListener(registry)
    for ms in (0, 3, 400, 400_000):
        lst.headrace_query_progress(progress={
            "id": "qid", "name": "h", "batchId": 0, "numInputRows": 5, "durationMs": {"addBatch": ms},
            "sources": [], "sink": {"description": "noop", "numOutputRows": -1, "metrics": {}},
        })  # fmt: skip
    labels = {"query": "h", "query_id": "qid", "phase": "addBatch"}

    def bucket(le: str) -> float | None:
        return registry.get_sample_value("headrace_batch_duration_seconds_bucket", {**labels, "le": le})

    assert (bucket("0.001"), bucket("0.005"), bucket("0.5"), bucket("300.0"), bucket("+Inf")) == (1, 2, 3, 3, 4)
    assert registry.get_sample_value("headrace_batch_duration_seconds_count", labels) == 4
    assert registry.get_sample_value("headrace_batch_duration_seconds_sum", labels) == pytest.approx(400.403)
    q = {"query": "h", "query_id": "qid"}
    assert registry.get_sample_value("headrace_input_rows_total", q) == 20
    assert registry.get_sample_value("headrace_output_rows_total", q) is None  # a negative increment is not counted
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        PrometheusListener(registry)  # one listener per registry
