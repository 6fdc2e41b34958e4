"""Benchmark of stream-stream joins. Run from the repo root:
``.venv/bin/python bench/stream_join.py [--full] [--no-spark]``.

A stream-stream inner join of two rate-micro-batch streams (``--full``: 1M x 1M rows; default a
tenth), 10 batches, each batch's rows one minute later than the last, joined on the row's
number with a 10-minute bound (``l.k = r.k AND l.ts BETWEEN r.ts - INTERVAL 10 MINUTES AND
r.ts``; both sides watermarked, 1 minute), into ``noop``: every row matches once, and rows
leave the state as the watermark passes their bound. Timed from ``start()`` to the end of the
query, memory state store, against the same query on PySpark ``local[2]`` (RocksDB state
store; goal >= 10x). Prints the ratio and the machine's load average; asserts nothing. On a
loaded machine the figures are indicative.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _common import spark_session  # noqa: E402

import headrace as hr  # noqa: E402

START_MS = 1_700_000_020_000
ADVANCE_MS = 60_000  # one minute per batch
BATCHES = 10
COND = "l.k = r.rk AND l.ts BETWEEN r.rts - INTERVAL 10 MINUTES AND r.rts"


def headrace_run(rows: int, backend: str = "memory") -> tuple[float, int, dict[str, Any]]:
    per = rows // BATCHES
    progress: list[dict[str, Any]] = []

    def side(name: str, k: str, ts: str) -> Any:
        return (hr.read_stream.format("rate-micro-batch")
                .options(rowsPerBatch=per, totalRows=rows, numPartitions=2, startTimestamp=START_MS,
                         advanceMillisPerBatch=ADVANCE_MS).load()
                .select_expr(f"value AS {k}", f"timestamp AS {ts}").with_watermark(ts, "1 minute").alias(name))  # fmt: skip

    with tempfile.TemporaryDirectory() as chk:
        t = time.perf_counter()
        q = (side("l", "k", "ts").join(side("r", "rk", "rts"), COND)
             .write_stream.format("noop").option("checkpointLocation", chk).option("stateStore", backend)
             .on_progress(lambda p: progress.append(p.to_dict())).trigger(available_now=True).start())  # fmt: skip
        q.await_termination()
        elapsed = time.perf_counter() - t
        if q.exception() is not None:
            raise RuntimeError(str(q.exception()))
    out = sum(int((p.get("sink") or {}).get("numOutputRows") or 0) for p in progress)
    last = progress[-1]["stateOperators"][0] if progress else {}
    return elapsed, out, last


def spark_run(spark: Any, rows: int) -> float:
    from pyspark.sql import functions as F

    per = rows // BATCHES

    def side(name: str, k: str, ts: str) -> Any:
        return (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", per).option("numPartitions", 2)
                .option("startTimestamp", START_MS).option("advanceMillisPerBatch", ADVANCE_MS).load()
                .selectExpr(f"value AS {k}", f"timestamp AS {ts}").withWatermark(ts, "1 minute").alias(name))  # fmt: skip

    with tempfile.TemporaryDirectory() as chk:
        df = side("l", "k", "ts").join(side("r", "rk", "rts"), F.expr(COND))
        t = time.perf_counter()
        q = (df.writeStream.format("noop").option("checkpointLocation", chk)
             .trigger(processingTime="0 seconds").start())  # fmt: skip
        # rate-micro-batch is unbounded in Spark: stop once the last batch of the input is done
        while True:
            if [p for p in q.recentProgress if p["batchId"] >= BATCHES - 1 and p["numInputRows"] > 0]:
                break
            if q.exception() is not None:
                raise RuntimeError(str(q.exception()))
            q.awaitTermination(0.05)
        elapsed = time.perf_counter() - t
        q.stop()
    return elapsed


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true", help="the full size (1M x 1M rows)")
    ap.add_argument("--no-spark", action="store_true", help="skip PySpark")
    args = ap.parse_args(argv)
    rows = 1_000_000 if args.full else 100_000
    res: dict[str, Any] = {}
    print(f"stream-stream inner join, {rows:,} x {rows:,} rows in {BATCHES} batches, joined on {COND!r}; "
          f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    headrace_run(rows // 10)  # warm-up
    h, out, last = headrace_run(rows)
    print(f"   headrace {h:.2f} s ({2 * rows / h:,.0f} input rows/s, {out:,} rows out; state at the end: "
          f"{last.get('numRowsTotal')} rows)")  # fmt: skip
    res.update(headrace_s=h, rows_out=out)
    spark = None if args.no_spark else spark_session("headrace-bench-join", "3g")
    if spark is None:
        print("   PySpark: skipped (--no-spark, or no pyspark/Java)")
    else:
        try:
            spark_run(spark, rows // 10)  # warm-up
            s = spark_run(spark, rows)
            print(f"   PySpark local[2] {s:.2f} s: ratio {s / h:.1f}x (goal >= 10x)")
            res.update(spark_s=s, vs_spark=s / h)
        finally:
            spark.stop()
    print(f"   load average after: {os.getloadavg()[0]:.1f}")
    return res


if __name__ == "__main__":
    main()
