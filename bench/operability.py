"""Cost of operability per batch: the progress history, the Prometheus listener, OpenTelemetry.

1. Per-call cost of each listener on a real progress record (µs per batch): the Prometheus
   listener, the OpenTelemetry listener (on the query's thread: queueing; the SDK work with
   in-memory exporters on its worker thread), the history's ``append``.
2. Engine wall time per 1-row batch (where per-batch overhead dominates) with nothing, with the
   progress history, and with the history + the Prometheus listener. Goal: each adds < 0.2 ms.

    .venv/bin/python bench/operability.py [--batches 300] [--calls 5000] [--rounds 6]

On a shared 2-core machine the engine figures vary by +-1 ms between runs of the same
configuration; the per-call figures of part 1 are the reliable ones.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

import headrace as hr
import headrace.engine.setup as engine_setup
from headrace.history import ProgressHistory
from headrace.plugins import registry


class _NoHistory(ProgressHistory):
    def start(self, **kw: Any) -> None:
        pass

    def append(self, progress: Any) -> None:
        pass

    def finish(self, **kw: Any) -> None:
        pass


def _record() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as chk:
        q = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=1000, totalRows=1000).load()
             .write_stream.format("noop").option("checkpointLocation", chk).trigger(available_now=True).start())  # fmt: skip
        q.await_termination()
        last = q.last_progress
        assert last is not None
        return last


def per_call(fn: Any, calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls * 1e6


def engine_ms_per_batch(batches: int) -> float:
    with tempfile.TemporaryDirectory() as chk:
        t = time.perf_counter()
        q = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=1, totalRows=batches).load()
             .write_stream.format("noop").option("checkpointLocation", chk).option("checkpointFsync", False)
             .trigger(available_now=True).start())  # fmt: skip
        q.await_termination()
        return (time.perf_counter() - t) / batches * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    record = _record()

    from prometheus_client import CollectorRegistry

    from headrace_prometheus import PrometheusListener

    prom = PrometheusListener(CollectorRegistry())
    print(f"prometheus listener:    {per_call(lambda: prom.headrace_query_progress(progress=record), args.calls):8.1f} µs per batch")
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from headrace_prometheus.otel import OtelListener

        tp = TracerProvider()
        tp.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
        otel = OtelListener(tp, MeterProvider(metric_readers=[InMemoryMetricReader()]))
        t = time.perf_counter()
        on_thread = per_call(lambda: otel.headrace_query_progress(progress=record), args.calls)
        otel.flush(600)
        worker = (time.perf_counter() - t) / args.calls * 1e6
        print(f"opentelemetry listener: {on_thread:8.1f} µs per batch on the query's thread "
              f"(the SDK work, {worker:.0f} µs per batch, on its worker thread)")
        tp.shutdown()
    except ImportError:
        print("opentelemetry listener: not installed (pip install 'headrace-prometheus[otel]')")
    with tempfile.TemporaryDirectory() as d:
        h = ProgressHistory(d, keep=100)
        h.start(id="i", run_id="r", name="n")
        n = [0]

        def append() -> None:
            n[0] += 1
            h.append({**record, "batchId": n[0]})

        print(f"history append:         {per_call(append, args.calls):8.1f} µs per batch (the write is on its own thread)")
        h.finish(run_id="r", exception=None, batch_id=n[0])

    reg = registry()
    reg.names()
    plugin = next(p for p in reg.pm.get_plugins() if getattr(p, "__name__", "") == "headrace_prometheus._plugin")
    name = reg.pm.get_name(plugin)
    reg.pm.unregister(plugin)
    results: dict[str, list[float]] = {"nothing": [], "history": [], "history + prometheus": []}
    modes = list(results)
    for round_ in range(args.rounds):  # interleaved, in a rotating order: the machine's noise hits all alike
        for mode in modes[round_ % 3:] + modes[: round_ % 3]:
            if mode == "history + prometheus":
                reg.pm.register(plugin, name=name)
            engine_setup.ProgressHistory = _NoHistory if mode == "nothing" else ProgressHistory  # type: ignore[misc]
            results[mode].append(engine_ms_per_batch(args.batches))
            if mode == "history + prometheus":
                reg.pm.unregister(plugin)
    engine_setup.ProgressHistory = ProgressHistory  # type: ignore[misc]
    reg.pm.register(plugin, name=name)
    base = statistics.median(results["nothing"])
    for k, v in results.items():
        m = statistics.median(v)
        print(f"engine, 1-row batches, {k:22s} {m:6.3f} ms per batch ({m - base:+.3f} ms)")


if __name__ == "__main__":
    main()
