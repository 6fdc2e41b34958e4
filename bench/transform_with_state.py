"""Benchmark of ``transform_with_state``. Run from the repo root:
``.venv/bin/python bench/transform_with_state.py [--full] [--no-spark]``.

Ratios are measured in the same run:

1. **Per-key running count with an event-time timer** (rate-micro-batch -> with_watermark ->
   group_by(value % keys).transform_with_state(...) -> noop, update mode, memory state store),
   from ``start()`` to the end of the query, written per key (``handle_input_rows``) and with
   the opt-in batched methods (``handle_input_batch``), against PySpark ``local[2]`` running
   the same processor with ``transformWithStateInPandas`` (RocksDB state store; goal >= 10x)
   and against a hand-written Python dict loop over the same rows without checkpoints (goal
   >= 0.5). Wall and CPU seconds of each side (CPU: the process and its children, e.g.
   Spark's JVM and Python workers), and the load average, are printed; and headrace's CPU per
   row, which is per ``handle_input_rows`` call here (every key has one row per batch).
2. **Cost per batch vs state size**: one batch touching 1k keys with many keys in state vs
   with 10k (goal <= 2x), both backends; median of 7 batches, each ending once its state is
   durable.

Defaults are small (a tenth of each size); ``--full`` runs the full sizes (1M rows over 100k
keys; 1M keys in state). Asserts nothing. On a loaded machine the figures are indicative.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
from _common import spark_session, tree_cpu  # noqa: E402

import headrace as hr  # noqa: E402

START_MS = 1_700_000_000_000
ADVANCE_MS = 1_000
DELAY_MS = 1_000
TIMER_MS = 5_000


class CountWithTimer(hr.StatefulProcessor):
    """A running count per key; one event-time timer per key, TIMER_MS after its first row;
    when it fires, the count is emitted and the key's state cleared."""

    def init(self, handle: hr.StatefulProcessorHandle) -> None:
        self.count = handle.get_value_state("count", "n BIGINT")

    def handle_input_rows(self, key: tuple[Any, ...], rows: pa.Table, tv: hr.TimerValues) -> Iterator[Any]:
        cur = self.count.get()
        if cur is None:
            first = int(rows.column("timestamp").to_numpy().min().astype(np.int64)) // 1000
            self.handle.register_timer(first + TIMER_MS)
            self.count.update((rows.num_rows,))
        else:
            self.count.update((cur[0] + rows.num_rows,))
        return iter(())

    def handle_expired_timer(self, key: tuple[Any, ...], tv: hr.TimerValues, info: hr.ExpiredTimerInfo
                             ) -> Iterator[Any]:  # fmt: skip
        n = self.count.get()
        self.count.clear()
        yield (key[0], n[0] if n else 0)


class CountWithTimerBatched(hr.StatefulProcessor):
    """:class:`CountWithTimer` with the opt-in batched methods: every key of the batch at once."""

    def init(self, handle: hr.StatefulProcessorHandle) -> None:
        self.count = handle.get_value_state("count", "n BIGINT")

    def handle_input_batch(self, batch: hr.KeyBatch, tv: hr.TimerValues) -> Iterator[Any]:
        assert batch.rows is not None and batch.offsets is not None  # (None only for expired timers)
        cur, exists = self.count.get_batch().column("n"), self.count.exists_batch()
        ts = batch.rows.column("timestamp").cast(pa.int64()).to_numpy()
        first = np.minimum.reduceat(ts, batch.offsets[:-1]) // 1000
        self.handle.register_timer_batch(first + TIMER_MS, where=~exists)
        self.count.update_batch({"n": pc.add(pc.fill_null(cur, 0), pa.array(batch.counts()))})
        return iter(())

    def handle_expired_timer_batch(self, batch: hr.KeyBatch, tv: hr.TimerValues, expiry: np.ndarray
                                   ) -> Iterator[Any]:  # fmt: skip
        n = pc.fill_null(self.count.get_batch().column("n"), 0)
        self.count.clear_batch()
        yield pa.table({"k": batch.keys.column("k"), "n": n})


def headrace_run(rows: int, per: int, keys: int, backend: str = "memory", batched: bool = False
                 ) -> tuple[float, float, int]:  # fmt: skip
    """Wall and CPU seconds of the query, and the rows it emitted."""
    out = 0
    progress: list[Any] = []
    proc = CountWithTimerBatched() if batched else CountWithTimer()
    with tempfile.TemporaryDirectory() as chk:
        c = tree_cpu()
        t = time.perf_counter()
        q = (hr.read_stream.format("rate-micro-batch")
             .options(rowsPerBatch=per, totalRows=rows, numPartitions=2, startTimestamp=START_MS,
                      advanceMillisPerBatch=ADVANCE_MS).load()
             .with_watermark("timestamp", f"{DELAY_MS} milliseconds")
             .with_column("k", f"value % {keys}")
             .group_by("k").transform_with_state(proc, "k BIGINT, n BIGINT", "update", "event_time")
             .write_stream.format("noop").option("checkpointLocation", chk).option("stateStore", backend)
             .output_mode("update").on_progress(lambda p: progress.append(p.to_dict()))
             .trigger(available_now=True).start())  # fmt: skip
        q.await_termination()
        elapsed = time.perf_counter() - t
        cpu = tree_cpu() - c
    out = sum(
        int(p.get("numOutputRows") or (p.get("sink") or {}).get("numOutputRows") or 0) for p in progress
    )
    assert sum(p["numInputRows"] for p in progress) == rows
    return elapsed, cpu, out


def dict_loop(rows: int, per: int, keys: int) -> tuple[float, float, int]:
    """The same logic by hand: one dict of counts, one of timers, the watermark moved per batch."""
    values = np.arange(rows, dtype=np.int64)
    cpu0 = time.process_time()
    t = time.perf_counter()
    counts: dict[int, int] = {}
    timers: dict[int, int] = {}
    emitted = 0
    max_ts = None
    for b in range(0, rows, per):
        wm = (max_ts - DELAY_MS) if max_ts is not None else None
        ts = START_MS + (b // per) * ADVANCE_MS
        for v in values[b : b + per].tolist():
            k = v % keys
            c = counts.get(k)
            if c is None:
                counts[k] = 1
                timers[k] = ts + TIMER_MS
            else:
                counts[k] = c + 1
        if wm is not None:
            for k in [k for k, at in timers.items() if at < wm]:
                del timers[k]
                counts.pop(k, None)
                emitted += 1
        max_ts = ts if max_ts is None else max(max_ts, ts)
    return time.perf_counter() - t, time.process_time() - cpu0, emitted


def spark_run(spark: Any, rows: int, per: int, keys: int) -> tuple[float, float]:
    import pandas as pd
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class SparkCountWithTimer(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.handle = handle
            self.count = handle.getValueState("count", "n BIGINT")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            n, first = 0, None
            for pdf in rows:
                n += len(pdf)
                m = pd.Timestamp(pdf["timestamp"].min()).value // 1_000_000
                first = m if first is None else min(first, m)
            held = self.count.get() if self.count.exists() else None
            if held is not None:
                self.count.update((held[0] + n,))
            else:
                assert first is not None  # (a key's call has rows)
                self.handle.registerTimer(first + TIMER_MS)
                self.count.update((n,))
            return iter([])

        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Any:
            n = self.count.get()[0] if self.count.exists() else 0
            self.count.clear()
            yield pd.DataFrame({"k": [key[0]], "n": [n]})

        def close(self) -> None:
            pass

    batches = rows // per
    with tempfile.TemporaryDirectory() as chk:
        df = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", per).option("numPartitions", 2)
              .option("startTimestamp", START_MS).option("advanceMillisPerBatch", ADVANCE_MS).load()
              .withWatermark("timestamp", f"{DELAY_MS} milliseconds").withColumn("k", F.col("value") % keys)
              .groupBy("k").transformWithStateInPandas(SparkCountWithTimer(), "k BIGINT, n BIGINT", "update",
                                                       "EventTime"))  # fmt: skip
        c = tree_cpu()
        t = time.perf_counter()
        q = (df.writeStream.format("noop").outputMode("update").option("checkpointLocation", chk)
             .trigger(processingTime="0 seconds").start())  # fmt: skip
        # rate-micro-batch is unbounded in Spark: stop once the last batch of the input is done
        while True:
            if [p for p in q.recentProgress if p["batchId"] >= batches - 1 and p["numInputRows"] > 0]:
                break
            if q.exception() is not None:
                raise RuntimeError(str(q.exception()))
            q.awaitTermination(0.05)
        elapsed = time.perf_counter() - t
        cpu = tree_cpu() - c
        q.stop()
    return elapsed, cpu


def state_cost(backend: str, state_keys: int, batched: bool, touch: int = 1000, fill_batch: int = 100_000
               ) -> tuple[float, float]:  # fmt: skip
    """Median wall and CPU seconds (the process's, state writes included) of a batch touching
    ``touch`` keys with ``state_keys`` keys in state (operator and store only; each batch ends
    once its state is durable). The periodic snapshot (every ``stateSnapshotInterval``
    batches, in the background, its cost growing with the state) is settled between batches,
    outside the timing, as in bench/transforms_stateful.py. The state is filled
    by the processor measured (``batched`` or per key), in the same run, as a query would."""
    from headrace.transforms.operator import BatchInfo, OperatorContext
    from headrace.transforms.transform_with_state import TransformWithStateOperator

    schema = pa.schema([("k", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC"))])

    def table(keys: np.ndarray, ts_ms: int) -> pa.Table:
        ts = pa.array(np.full(len(keys), ts_ms * 1000, np.int64)).cast(pa.timestamp("us", tz="UTC"))
        return pa.table({"k": keys, "timestamp": ts}, schema=schema)

    proc: Any = CountWithTimerBatched() if batched else CountWithTimer()
    with tempfile.TemporaryDirectory() as d:
        op = TransformWithStateOperator(["k"], proc, "k BIGINT, n BIGINT", "update", "event_time",
                                        watermark_column="timestamp")  # fmt: skip
        op.output_schema(schema)
        op.open(OperatorContext(index=0, state_path=d, state_backend=backend, output_mode="update"))
        batch = 0

        def run(t: pa.Table) -> tuple[float, float]:
            nonlocal batch
            info = BatchInfo(batch, watermark_ms=START_MS, timestamp_ms=START_MS)
            t0, c0 = time.perf_counter(), time.process_time()
            op.begin(info)
            op.process(t, info)
            op.finish(info)
            w = op.state_write()
            if w is not None:
                w.result()
            batch += 1
            took = time.perf_counter() - t0, time.process_time() - c0
            for (
                store
            ) in op._stores():  # a snapshot this batch made due runs here, not in the next timed batch
                store.settle()
            return took

        for lo in range(0, state_keys, fill_batch):
            run(table(np.arange(lo, min(state_keys, lo + fill_batch), dtype=np.int64), START_MS + 10**9))
        rng = np.random.default_rng(7)
        times = [run(table(rng.choice(state_keys, touch, replace=False).astype(np.int64), START_MS + 10**9))
                 for _ in range(7)]  # fmt: skip
        op.close()
    return statistics.median(t for t, _ in times), statistics.median(c for _, c in times)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--full", action="store_true", help="the full sizes (1M rows, 100k keys, 1M keys in state)"
    )
    ap.add_argument("--no-spark", action="store_true", help="skip PySpark")
    ap.add_argument(
        "--only", choices=["query", "state"], help="run only part 1 (the query) or 2 (state size)"
    )
    args = ap.parse_args(argv)
    scale = 1 if args.full else 10
    rows, keys, per = 1_000_000 // scale, 100_000 // scale, 100_000 // scale
    res: dict[str, Any] = {}
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    if args.only != "state":
        print(
            f"1. per-key count + event-time timer: {rows:,} rows over {keys:,} keys, {per:,} rows per batch"
        )
        headrace_run(per, per, keys // 10)  # warm-up
        headrace_run(per, per, keys // 10, batched=True)
        d, dc, emitted = dict_loop(rows, per, keys)
        print(f"   dict loop (no checkpoint) {d:.2f} s, CPU {dc:.2f} s ({emitted:,} timers)")
        for batched in (False, True):
            h, hc, out = headrace_run(rows, per, keys, batched=batched)
            name = "batched" if batched else "per-key"
            print(f"   headrace {name:8s} {h:.2f} s, CPU {hc:.2f} s ({rows / h:,.0f} rows/s, {out:,} rows out; CPU "
                  f"{hc / rows * 1e6:.1f} µs per row): vs dict loop {d / h:.2f} (CPU {dc / hc:.2f}; goal >= "
                  "0.5)")  # fmt: skip
            res.update({f"headrace_{name}_s": h, f"headrace_{name}_cpu": hc, f"vs_dict_{name}": d / h,
                        f"vs_dict_{name}_cpu": dc / hc})  # fmt: skip
        res.update(dict_loop_s=d, dict_loop_cpu=dc)
        spark = None if args.no_spark else spark_session("headrace-bench-tws", "2g")
        if spark is None:
            print("   PySpark: skipped (--no-spark, or no pyspark/Java)")
        else:
            try:
                spark_run(spark, per, per, keys // 10)  # warm-up
                s, sc = spark_run(spark, rows, per, keys)
                print(
                    f"   PySpark local[2] transformWithStateInPandas {s:.2f} s, CPU {sc:.2f} s (JVM + Python workers)"
                )
                for name in ("per-key", "batched"):
                    h, hc = res[f"headrace_{name}_s"], res[f"headrace_{name}_cpu"]
                    print(f"   headrace {name:8s} vs PySpark: {s / h:.1f}x (CPU {sc / hc:.1f}x; goal >= 10x)")
                    res.update({f"vs_spark_{name}": s / h, f"vs_spark_{name}_cpu": sc / hc})
                res.update(spark_s=s, spark_cpu=sc)
            finally:
                spark.stop()
    if args.only != "query":
        big = 1_000_000 // scale
        print(f"2. one batch touching 1k keys: {big:,} keys in state vs 10,000")
        for backend in ("memory", "rocksdb"):
            for batched in (False, True):
                small, small_cpu = state_cost(backend, 10_000, batched)
                large, large_cpu = state_cost(backend, big, batched)
                name = f"{backend} {'batched' if batched else 'per-key'}"
                print(f"   {name:16s} {small * 1e3:.1f} ms vs {large * 1e3:.1f} ms: {large / small:.2f}x; CPU "
                      f"{small_cpu * 1e3:.1f} vs {large_cpu * 1e3:.1f} ms: {large_cpu / small_cpu:.2f}x (goal <= 2x)")  # fmt: skip
                key = f"state_{backend}_{'batched' if batched else 'per_key'}"
                res[key], res[key + "_cpu"] = large / small, large_cpu / small_cpu
    print("(the figures of one run on this machine; a loaded machine makes them indicative only)")
    return res


if __name__ == "__main__":
    main()
