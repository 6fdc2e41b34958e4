"""End to end: a pipeline run with only the standard OTEL_* variables set exports its spans and
metrics over OTLP/HTTP, received here by a small collector stand-in on 127.0.0.1 and decoded
with the OTLP protobuf definitions."""

from __future__ import annotations

import gzip
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.cli_runner import cli_env, run_cli

PIPELINE = """
name = "otlp_run"
checkpoint = "chk"
[source]
format = "rate-micro-batch"
options = { rowsPerBatch = 100, totalRows = 300 }
[sink]
format = "noop"
"""


class Collector(ThreadingHTTPServer):
    def __init__(self) -> None:
        self.received: dict[str, list[bytes]] = {}
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        with self.server.lock:
            self.server.received.setdefault(self.path, []).append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    t = threading.Thread(target=c.serve_forever, daemon=True)
    t.start()
    yield c
    c.shutdown()
    c.server_close()


def test_otel_environment_variables_alone_export_spans_and_metrics(collector: Collector, tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text(PIPELINE)
    env = cli_env(os.getcwd(), OTEL_SERVICE_NAME="ingest-test",
                  OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{collector.server_port}")  # fmt: skip
    done = run_cli("run", tmp_path / "p.toml", env=env)
    assert done.returncode == 0, done.stderr
    spans = []
    for body in collector.received.get("/v1/traces", []):
        req = ExportTraceServiceRequest.FromString(body)
        for rs in req.resource_spans:
            service = {a.key: a.value.string_value for a in rs.resource.attributes}["service.name"]
            assert service == "ingest-test"
            for ss in rs.scope_spans:
                spans += list(ss.spans)
    batches = [s for s in spans if s.name == "headrace.batch"]
    assert len(batches) == 3
    ids = {s.span_id for s in batches}
    children = [s for s in spans if s.parent_span_id in ids]
    assert sorted({c.name for c in children}) == ["addBatch", "commitOffsets", "latestOffset", "walCommit"]
    assert len(children) == 12
    names = set()
    rows = 0
    for body in collector.received.get("/v1/metrics", []):
        for rm in ExportMetricsServiceRequest.FromString(body).resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    names.add(m.name)
                    if m.name == "headrace.input_rows":
                        rows = max(rows, *(p.as_int for p in m.sum.data_points))
    assert {"headrace.batches", "headrace.input_rows", "headrace.batch.duration"} <= names
    assert rows == 300
