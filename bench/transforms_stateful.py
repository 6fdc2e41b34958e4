"""Benchmark of headrace's stateful operators and state stores. Run from the repo root:
``.venv/bin/python bench/transforms_stateful.py [--full]``.

Ratios are measured in the same run:

1. **Windowed aggregation** (rate-micro-batch -> with_watermark -> group_by(window 1 minute,
   value % keys).agg(count, sum, avg) -> noop, update mode, state in memory and in RocksDB),
   from ``start()`` to the end of the query, against one DuckDB ``GROUP BY`` over all the rows
   at once (goal >= 0.5) and against PySpark ``local[2]`` Structured Streaming running the same
   query on the same input (Spark's own ``rate-micro-batch`` source generates the same rows;
   goal >= 3x Spark). Each side warms up with a small query first, then ``REPEAT`` (5) rounds
   run DuckDB and each backend once each, in an order that turns from round to round (the
   machine's speed drifts within a sitting; unequal or grouped repetitions would tilt the
   ratio); printed are the best run against the best run, and the median of the rounds'
   ratios. The median per-batch durations of the progress reports (trigger, addBatch, the
   state store's commit, WAL, commit entry) are printed next to it.
2. **Cost per batch vs state size**: one batch touching 1k keys with 1M keys in state vs with
   10k (goal <= 2x), both backends; median of 9 batches (wall, and CPU of the batch's thread;
   a batch ends once its state is durable: the operator's ``state_write()`` is waited for),
   and the store's work counters summed over the 9. The state is filled by 100k-row batches first; the snapshot
   the fill's rows make due (memory backend: in the background, after the fill's last batch)
   is waited for and reported before the 9 batches run, so that it is not charged to them;
   snapshots the 9 batches make due are included.
   Beside them, the same per-batch work written directly with numpy and pyarrow on one
   thread, without a checkpoint (``numpy_floor``: the floor for one core). ``--stages`` times
   the stages of the query's batches instead (wall and CPU of the query's thread, per batch).
3. **Memory stays bounded**: the windowed aggregation over 10M rows with a watermark, in a
   child process; its peak RSS next to that of a run over a tenth of the rows.

Defaults are small (a fraction of each size); ``--full`` runs the full sizes (1M rows,
10k keys, 100k-row batches; 1M keys in state; 10M rows). Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from _common import spark_session  # noqa: E402

import headrace as hr  # noqa: E402

START_MS = 1_700_000_000_000
ADVANCE_MS = 5_000
AGGS = ("count(*) AS n", "sum(value) AS s", "avg(value) AS a")
REPEAT = 5  # rounds of section 1 (each side once a round); the best run and the rounds' ratios count


# ---------------------------------------------------------------------------- 1. windowed aggregation
def headrace_windowed(rows: int, per: int, keys: int, backend: str) -> tuple[float, list[dict[str, Any]]]:
    progress: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as chk:
        t = time.perf_counter()
        q = (hr.read_stream.format("rate-micro-batch")
             .options(rowsPerBatch=per, totalRows=rows, numPartitions=2, startTimestamp=START_MS,
                      advanceMillisPerBatch=ADVANCE_MS).load()
             .with_watermark("timestamp", "10 seconds")
             .with_column("k", f"value % {keys}")
             .group_by(hr.window("timestamp", "1 minute"), "k").agg(*AGGS)
             .write_stream.format("noop").option("checkpointLocation", chk).option("stateStore", backend)
             .output_mode("update").on_progress(lambda p: progress.append(p.to_dict()))
             .trigger(available_now=True).start())  # fmt: skip
        q.await_termination()
        elapsed = time.perf_counter() - t
    assert sum(p["numInputRows"] for p in progress) == rows
    return elapsed, progress


def duckdb_query(rows: int, per: int, keys: int) -> Callable[[], float]:
    """A function that runs one DuckDB ``GROUP BY`` over all the rows the query reads (the
    same values and timestamps, registered as an Arrow table once) and returns its seconds."""
    import duckdb

    v = np.arange(rows, dtype=np.int64)
    ts = (START_MS + (v // per) * ADVANCE_MS) * 1000
    table = pa.table({"timestamp": pa.array(ts).cast(pa.timestamp("us", tz="UTC")), "value": v})
    con = duckdb.connect()
    con.register("events", table)
    sql = (f"SELECT time_bucket(INTERVAL 1 minute, timestamp) AS w, value % {keys} AS k, count(*) AS n, "
           "sum(value) AS s, avg(value) AS a FROM events GROUP BY ALL")  # fmt: skip

    def run() -> float:
        t = time.perf_counter()
        con.sql(sql).to_arrow_table()
        return time.perf_counter() - t

    return run


def numpy_floor(rows: int, per: int, keys: int) -> tuple[float, float]:
    """The same per-batch work as the query, written directly with numpy and pyarrow on one
    thread, without a checkpoint: generate the batch's rows as the rate source does, drop rows
    behind the watermark, assign 1-minute windows and keys, count and sum per (window, key)
    with ``bincount``, add into state arrays, emit the updated groups as an Arrow table (update
    mode) and serialise them as a changelog would be (Arrow IPC + CRC-32, not written), then
    evict closed windows. No fsync, no progress, no plugin or plan: the floor for one core.
    Best and median of ``REPEAT`` runs (seconds)."""
    import zlib

    win_us, delay_us = 60_000_000, 10_000_000
    ts_type = pa.timestamp("us", tz="UTC")

    def run() -> float:
        t = time.perf_counter()
        state: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        watermark = -(2**62)
        for lo in range(0, rows, per):
            value = np.arange(lo, min(rows, lo + per), dtype=np.int64)
            ts = np.full(len(value), (START_MS + (lo // per) * ADVANCE_MS) * 1000, dtype=np.int64)
            keep = ts >= watermark
            value, ts = value[keep], ts[keep]
            window = ts - ts % win_us
            first = int(window.min())
            group = (window - first) // win_us * keys + value % keys
            count = np.bincount(group, minlength=keys)
            total = np.bincount(group, weights=value, minlength=keys).astype(np.int64)
            parts = []
            for i in range(len(count) // keys):
                start = first + i * win_us
                n, s = state.setdefault(start, (np.zeros(keys, np.int64), np.zeros(keys, np.int64)))
                c, v = count[i * keys : (i + 1) * keys], total[i * keys : (i + 1) * keys]
                touched = np.flatnonzero(c)
                n[touched] += c[touched]
                s[touched] += v[touched]
                starts = pa.array(np.full(len(touched), start)).cast(ts_type)
                parts.append(pa.table({"window_start": starts, "window_end": pa.array(np.full(len(touched), start + win_us)).cast(ts_type),
                                       "k": touched, "n": n[touched], "s": s[touched], "a": s[touched] / n[touched]}))  # fmt: skip
            out = pa.concat_tables(parts)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, out.schema) as writer:
                writer.write_table(out)
            zlib.crc32(sink.getvalue())
            watermark = max(watermark, int(ts.max()) - delay_us)
            for start in [w for w in state if w + win_us <= watermark]:
                del state[start]
        return time.perf_counter() - t

    run()  # warm-up
    times = [run() for _ in range(REPEAT)]
    return min(times), statistics.median(times)


def spark_windowed(spark: Any, rows: int, per: int, keys: int) -> float:
    from pyspark.sql import functions as F

    batches = rows // per
    with tempfile.TemporaryDirectory() as chk:
        df = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", per).option("numPartitions", 2)
              .option("startTimestamp", START_MS).option("advanceMillisPerBatch", ADVANCE_MS).load()
              .withWatermark("timestamp", "10 seconds").withColumn("k", F.col("value") % keys)
              .groupBy(F.window("timestamp", "1 minute"), "k")
              .agg(F.count("*").alias("n"), F.sum("value").alias("s"), F.avg("value").alias("a")))  # fmt: skip
        t = time.perf_counter()
        q = (df.writeStream.format("noop").outputMode("update").option("checkpointLocation", chk)
             .trigger(processingTime="0 seconds").start())  # fmt: skip
        # rate-micro-batch is unbounded in Spark: stop once the last batch of the input is done
        while True:
            done = [p for p in q.recentProgress if p["batchId"] >= batches - 1 and p["numInputRows"] > 0]
            if done:
                break
            if q.exception() is not None:
                raise RuntimeError(str(q.exception()))
            time.sleep(0.005)
        elapsed = time.perf_counter() - t
        q.stop()
    return elapsed


#: the stages ``--stages`` times on the query's thread: (label, module, class or None, function)
STAGES = (
    ("plan: begin (state load)", "headrace.engine.plan", "PlanRunner", "begin"),
    ("plan: stateless steps", "headrace.engine.plan", "PlanRunner", "apply_stateless"),
    ("aggregation: partial", "headrace.engine.plan", "PlanRunner", "_partials_of"),
    ("aggregation: finish", "headrace.transforms.aggregate", "AggregateOperator", "finish"),
    ("  of which the merge", "headrace.transforms.aggregate", "AggregateOperator", "_merge"),
    ("planning the next batch", "headrace.engine.planner", "Planner", "plan_next"),
    ("progress report", "headrace.engine.microbatch", None, "report_progress"),
    ("sink commit order", "headrace.engine.commits", "CommitOrder", "before_sink_commit"),
)


def stage_times(rows: int, per: int, keys: int) -> None:
    """Where a windowed batch's time goes: the query of section 1 (memory state) over ``rows``
    rows with each of :data:`STAGES` timed (wall and CPU of the calling thread), per batch.
    The timers wrap engine internals, so a stage that was renamed is reported as not found."""
    import functools
    import importlib
    from collections import defaultdict

    wall: defaultdict[str, float] = defaultdict(float)
    cpu: defaultdict[str, float] = defaultdict(float)
    missing = []
    originals = []
    for label, module, cls, name in STAGES:
        owner = importlib.import_module(module)
        owner = getattr(owner, cls) if cls else owner
        f = getattr(owner, name, None)
        if f is None:
            missing.append(f"{module}.{cls + '.' if cls else ''}{name}")
            continue

        def timed(*a: Any, _f: Any = f, _label: str = label, **k: Any) -> Any:
            t, c = time.perf_counter(), time.thread_time()
            try:
                return _f(*a, **k)
            finally:
                wall[_label] += time.perf_counter() - t
                cpu[_label] += time.thread_time() - c

        originals.append((owner, name, f))
        setattr(owner, name, functools.wraps(f)(timed))
    try:
        headrace_windowed(per * 2, per, keys, "memory")  # warm-up
        wall.clear()
        cpu.clear()
        elapsed, progress = headrace_windowed(rows, per, keys, "memory")
    finally:
        for owner, name, f in originals:
            setattr(owner, name, f)
    n = len(progress)
    print(f"   stages of {n} batches ({elapsed * 1000 / n:.2f} ms a batch from start to end), per batch:")
    for label, *_ in STAGES:
        if label in wall:
            print(f"     {label:28s} wall {wall[label] * 1000 / n:6.2f} ms   CPU {cpu[label] * 1000 / n:6.2f} ms")
    for m in missing:
        print(f"     {m}: not found (renamed?), not timed")


# ---------------------------------------------------------------------------- 2. cost vs state size
def state_cost(backend: str, state_keys: int, touch: int = 1000, fill_batch: int = 100_000) -> dict[str, Any]:
    """One batch touching ``touch`` keys of ``state_keys`` in state (operator and store only)."""
    from headrace.transforms.aggregate import AggregateOperator
    from headrace.transforms.operator import BatchInfo, OperatorContext

    schema = pa.schema([("k", pa.int64()), ("value", pa.int64())])
    with tempfile.TemporaryDirectory() as d:
        op = AggregateOperator(["k"], list(AGGS))
        op.output_schema(schema)
        op.open(OperatorContext(index=0, state_path=d, state_backend=backend, output_mode="update"))
        batch = 0
        for lo in range(0, state_keys, fill_batch):
            k = np.arange(lo, min(state_keys, lo + fill_batch), dtype=np.int64)
            info = BatchInfo(batch)
            op.begin(info)
            op.process(pa.table({"k": k, "value": k}, schema=schema), info)
            op.finish(info)
            durable = op.state_write()
            if durable is not None:
                durable.result()
            batch += 1
        # the fill's own deferred work (the memory backend's background snapshot of the rows it
        # wrote, due after its last batch) is waited for and reported, not left to compete with
        # the batches timed below; snapshots those batches start are included in them
        t0 = time.perf_counter()
        op.store.settle()
        settle_s = time.perf_counter() - t0
        rng = np.random.default_rng(1)
        times, cpu, work = [], [], []
        for _ in range(9):
            k = rng.choice(state_keys, size=touch, replace=False).astype(np.int64)
            t = pa.table({"k": np.repeat(k, 10), "value": np.arange(touch * 10, dtype=np.int64)}, schema=schema)
            before = op.store.work.copy()
            info = BatchInfo(batch)
            t0, c0 = time.perf_counter(), time.thread_time()
            op.begin(info)
            op.process(t, info)
            op.finish(info)
            durable = op.state_write()  # the changelog's write and fsync, as the engine waits for it
            if durable is not None:
                durable.result()
            times.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
            work.append(op.store.work.minus(before))
            batch += 1
        rows_total = op.metrics()["numRowsTotal"]
        op.close()
    return {"median_ms": statistics.median(times) * 1000, "median_cpu_ms": statistics.median(cpu) * 1000,
            "work": {k: sum(w[k] for w in work) for k in work[0]}, "numRowsTotal": rows_total, "fill_settle_ms": settle_s * 1000,
            "batches_ms": [round(x * 1000, 1) for x in times]}  # fmt: skip


# ---------------------------------------------------------------------------- 3. memory
def memory_child(rows: int, backend: str) -> None:
    """In a child process: the windowed aggregation over ``rows`` rows with a watermark (windows
    close as event time advances), then print peak RSS and the final state size."""
    per = 100_000
    progress: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as chk:
        q = (hr.read_stream.format("rate-micro-batch")
             .options(rowsPerBatch=per, totalRows=rows, numPartitions=2, startTimestamp=START_MS,
                      advanceMillisPerBatch=ADVANCE_MS).load()
             .with_watermark("timestamp", "10 seconds")
             .with_column("k", "value % 10000")
             .group_by(hr.window("timestamp", "1 minute"), "k").agg(*AGGS)
             .write_stream.format("noop").option("checkpointLocation", chk).option("stateStore", backend)
             .output_mode("append").on_progress(lambda p: progress.append(p.to_dict()))
             .trigger(available_now=True).start())  # fmt: skip
        q.await_termination()
    peak = _peak_rss()
    states = [p["stateOperators"][0]["numRowsTotal"] for p in progress if p.get("stateOperators")]
    print(json.dumps({"rows": rows, "peak_rss": peak, "max_state_rows": max(states), "batches": len(progress)}))


def _peak_rss() -> int:
    """This process's peak resident set (``VmHWM``: unlike ``ru_maxrss``, not inherited from
    the parent across fork and exec)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_run(rows: int, backend: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--memory-child", str(rows), backend], capture_output=True, text=True,
                         check=True, cwd=ROOT)  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


# ---------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="the full sizes (1M rows, 1M keys in state, 10M rows)")
    ap.add_argument("--no-spark", action="store_true", help="skip the PySpark comparison")
    ap.add_argument("--sections", default="1,2,3", help="which sections to run (comma-separated; default all)")
    ap.add_argument("--stages", action="store_true",
                    help="only time the stages of the windowed query's batches (memory state, 3M rows with --full)")  # fmt: skip
    ap.add_argument("--memory-child", nargs=2, metavar=("ROWS", "BACKEND"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.memory_child:
        memory_child(int(args.memory_child[0]), args.memory_child[1])
        return {}
    rows, per, keys = (1_000_000, 100_000, 10_000) if args.full else (200_000, 20_000, 2_000)
    big, small = (1_000_000, 10_000) if args.full else (100_000, 10_000)
    mem_rows = 10_000_000 if args.full else 1_000_000
    if args.stages:
        stage_times(rows * 3, per, keys)
        return {}
    report: dict[str, Any] = {"full": args.full, "cpus": os.cpu_count()}
    sections = {int(x) for x in args.sections.split(",") if x.strip()}
    if 1 in sections:
        section_windowed(report, rows, per, keys, args.no_spark)
    if 2 in sections:
        section_state_size(report, big, small)
    if 3 in sections:
        section_memory(report, mem_rows)
    print(json.dumps(report, default=str))
    return report


def section_windowed(report: dict[str, Any], rows: int, per: int, keys: int, no_spark: bool) -> None:
    print(f"1. windowed aggregation: {rows:,} rows, {keys:,} keys, {per:,}-row batches, update mode")
    headrace_windowed(per * 2, per, keys, "memory")  # warm-up (imports, DuckDB)
    duckdb_run = duckdb_query(rows, per, keys)
    duckdb_run()  # warm-up
    floor, report["numpy_floor_median_s"] = numpy_floor(rows, per, keys)
    report["numpy_floor_s"] = floor
    # rounds: DuckDB, then each backend, one run each, the order turning from round to round,
    # so that a machine whose speed drifts during the sitting weighs on every side alike
    backends = ("memory", "rocksdb")
    duck_times: list[float] = []
    runs: dict[str, list[tuple[float, list[dict[str, Any]]]]] = {b: [] for b in backends}
    sides = ["duckdb", *backends]
    for k in range(REPEAT):
        turn = k % len(sides)
        for side in sides[turn:] + sides[:turn]:
            if side == "duckdb":
                duck_times.append(duckdb_run())
            else:
                runs[side].append(headrace_windowed(rows, per, keys, side))
    duck = min(duck_times)
    report["duckdb_s"], report["duckdb_median_s"] = duck, statistics.median(duck_times)
    print(f"   DuckDB, one GROUP BY over all rows:       {duck * 1000:8.0f} ms")
    print(f"   the same per-batch work on one thread:    {floor * 1000:8.0f} ms   DuckDB/floor = {duck / floor:.2f} "
          "(numpy + pyarrow, no checkpoint: the floor for one core)")  # fmt: skip
    for backend in backends:
        hr_s = min(r[0] for r in runs[backend])
        hr_median = statistics.median(r[0] for r in runs[backend])
        paired = statistics.median(d / r[0] for d, r in zip(duck_times, runs[backend], strict=True))
        report[f"headrace_{backend}_median_s"] = hr_median
        report[f"headrace_{backend}_paired_ratio"] = paired
        batches_s = min(sum(p["durationMs"]["triggerExecution"] for p in r[1]) for r in runs[backend]) / 1000
        report[f"headrace_{backend}_s"] = hr_s
        report[f"headrace_{backend}_batches_s"] = batches_s
        best = min(runs[backend], key=lambda r: r[0])[1]
        med = {k: statistics.median(p["durationMs"].get(k, 0) for p in best if p["numInputRows"])
               for k in ("triggerExecution", "addBatch", "walCommit", "commitOffsets")}  # fmt: skip
        commit_ms = statistics.median(p["stateOperators"][0]["commitTimeMs"] for p in best if p["numInputRows"])
        report[f"headrace_{backend}_per_batch_ms"] = {**med, "stateCommit": commit_ms}
        print(f"   headrace ({backend:7s}), start to end:       {hr_s * 1000:8.0f} ms   DuckDB/headrace = "
              f"{duck / hr_s:.2f} (best against best; goal >= 0.5); per round {paired:.2f} (median of the "
              f"{REPEAT} rounds' ratios); median of {REPEAT} runs {hr_median * 1000:.0f} ms; its batches alone "
              f"{batches_s * 1000:.0f} ms ({duck / batches_s:.2f}); per batch (median ms): "
              f"{med['triggerExecution']} in all, addBatch {med['addBatch']} (state commit {commit_ms}), WAL "
              f"{med['walCommit']}, commit {med['commitOffsets']}")  # fmt: skip
    spark = None if no_spark else spark_session("headrace-bench-stateful", rocksdb_state=False)
    if spark is None:
        print("   PySpark: skipped (--no-spark, or no pyspark or Java)")
    else:
        spark_windowed(spark, per * 2, per, keys)  # warm-up (JIT, codegen)
        sp = min(spark_windowed(spark, rows, per, keys) for _ in range(REPEAT))
        report["spark_s"] = sp
        print(f"   PySpark local[2] Structured Streaming:    {sp * 1000:8.0f} ms   Spark/headrace(memory) = "
              f"{sp / report['headrace_memory_s']:.1f}x (goal >= 3x)")  # fmt: skip
        spark.stop()


def section_state_size(report: dict[str, Any], big: int, small: int) -> None:
    print(f"2. one batch touching 1,000 keys, {big:,} vs {small:,} keys in state")
    for backend in ("memory", "rocksdb"):
        b = state_cost(backend, big)
        s = state_cost(backend, small)
        report[f"cost_{backend}"] = {"big": b, "small": s, "ratio": b["median_ms"] / s["median_ms"]}
        same = {k: f"{v} vs {s['work'][k]}" for k, v in b["work"].items() if v != s["work"][k]}
        print(f"   {backend:7s}: {b['median_ms']:6.1f} ms vs {s['median_ms']:6.1f} ms = {b['median_ms'] / s['median_ms']:.2f}x "
              f"(goal <= 2x); CPU of the batch's thread {b['median_cpu_ms']:.1f} vs {s['median_cpu_ms']:.1f} ms = "
              f"{b['median_cpu_ms'] / s['median_cpu_ms']:.2f}x; work counters "
              f"{'identical' if not same else f'differ: {same}'}; the fill's snapshot "
              f"{b['fill_settle_ms']:.0f} ms")  # fmt: skip


def section_memory(report: dict[str, Any], mem_rows: int) -> None:
    print(f"3. memory: windowed aggregation with a watermark, {mem_rows:,} rows vs {mem_rows // 10:,}, append mode")
    for backend in ("memory", "rocksdb"):
        a = memory_run(mem_rows // 10, backend)
        b = memory_run(mem_rows, backend)
        report[f"memory_{backend}"] = {"small": a, "big": b}
        print(f"   {backend:7s}: peak RSS {b['peak_rss'] / 2**20:6.0f} MiB over {mem_rows:,} rows vs "
              f"{a['peak_rss'] / 2**20:6.0f} MiB over {mem_rows // 10:,}; state at most {b['max_state_rows']:,} rows")  # fmt: skip


if __name__ == "__main__":
    main()
