"""Engine overhead: rate-micro-batch -> noop through headrace vs iterating the same Arrow batches.

Prints rows/s both ways and their ratio (goal >= 0.9 at 64k-row batches), the same at 1M-row batches, and the median
per-batch engine overhead with a checkpoint on local disk (goal < 5 ms): the time of a batch
that is not spent reading or writing rows (triggerExecution - addBatch), and the whole time of a
1-row batch.

    .venv/bin/python bench/core_overhead.py [--batches 100] [--rows 65536]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import headrace as hr
from headrace.plugins import registry
from headrace.protocols import ReadLimit, SourceContext


def direct(rows: int, batches: int, partitions: int) -> float:
    """The same batches, read straight from the source class: no engine, no checkpoint."""
    spec = registry().get("rate-micro-batch")
    opts = spec.source_options.parse({"rowsPerBatch": rows, "totalRows": rows * batches, "numPartitions": partitions})
    src = spec.load_source()(opts, SourceContext())
    start = src.initial_offset()
    n = 0
    t = time.perf_counter()
    for _ in range(batches):
        end = src.latest_offset(start, ReadLimit(max_rows=rows))
        for p in src.partitions(start, end):
            for b in src.read(p):
                n += b.num_rows
        start = end
    elapsed = time.perf_counter() - t
    assert n == rows * batches
    return n / elapsed


def engine(rows: int, batches: int, partitions: int, fsync: bool = True) -> tuple[float, list[dict]]:
    progress: list[dict] = []
    with tempfile.TemporaryDirectory() as chk:
        t = time.perf_counter()
        q = (hr.read_stream.format("rate-micro-batch")
             .options(rowsPerBatch=rows, totalRows=rows * batches, numPartitions=partitions).load()
             .write_stream.format("noop").option("checkpointLocation", chk)
             .option("checkpointFsync", fsync)
             .on_progress(lambda p: progress.append(p.to_dict()))
             .trigger(available_now=True).start())  # fmt: skip
        q.await_termination()
        elapsed = time.perf_counter() - t
    n = sum(p["numInputRows"] for p in progress)
    assert n == rows * batches, n
    return n / elapsed, progress


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--rows", type=int, default=65536)
    ap.add_argument("--partitions", type=int, default=1)
    args = ap.parse_args()
    engine(args.rows, 5, args.partitions)  # warm up imports and caches
    direct(args.rows, 5, args.partitions)
    base, ours, nosync = [], [], []
    for _ in range(3):  # interleave to share the machine's noise
        base.append(direct(args.rows, args.batches, args.partitions))
        rate, progress = engine(args.rows, args.batches, args.partitions)
        ours.append(rate)
        nosync.append(engine(args.rows, args.batches, args.partitions, fsync=False)[0])
    b, o, n = statistics.median(base), statistics.median(ours), statistics.median(nosync)
    overhead = statistics.median(p["durationMs"]["triggerExecution"] - p["durationMs"]["addBatch"] for p in progress)
    big_rows = 1 << 20
    big_base = direct(big_rows, 20, args.partitions)
    big_ours = engine(big_rows, 20, args.partitions)[0]
    _, tiny = engine(1, 200, 1)
    tiny_total = statistics.median(p["durationMs"]["triggerExecution"] for p in tiny)
    print(f"rate-micro-batch -> noop, {args.batches} batches of {args.rows:,} rows, {args.partitions} partition(s)")
    print(f"  direct iteration : {b:,.0f} rows/s")
    print(f"  through headrace : {o:,.0f} rows/s")
    print(f"  ratio            : {o / b:.2f}  (goal >= 0.9)")
    print(f"  with checkpointFsync=false: {n:,.0f} rows/s, ratio {n / b:.2f}")
    print(f"  at {big_rows:,}-row batches: direct {big_base:,.0f} rows/s, headrace {big_ours:,.0f} rows/s, "
          f"ratio {big_ours / big_base:.2f}")
    print(f"  median per-batch engine overhead (triggerExecution - addBatch): {overhead:.1f} ms  (goal < 5 ms)")
    print(f"  median whole batch of 1 row (offsets + commit + progress):       {tiny_total:.1f} ms")


if __name__ == "__main__":
    main()
