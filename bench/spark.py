"""Benchmark of headrace.spark. Run from the repo root: ``.venv/bin/python bench/spark.py``.

The same pipeline, cloudFiles (Parquet files) -> delta, trigger availableNow, over the same
files in the same run:

1. headrace alone: ``hr.read_stream.format("cloudFiles") ... write_stream.format("delta")``.
2. Spark with the adapter: ``spark.readStream.format("headrace.cloudFiles") ...
   writeStream.format("headrace.delta")`` in a local Spark (``local[N]``).

Each prints rows/s (rows ingested / wall time from start to the end of the query, the Spark
session already started and warmed up by a small query of its own) and the ratio Spark /
headrace. Falls back to rate-micro-batch -> files when the cloudfiles or delta plugin is not
installed (and says so). Asserts nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

import headrace as hr  # noqa: E402


def write_files(folder: Path, files: int, rows: int, offset: int = 0) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        lo = offset + f * rows
        ids = pa.array(range(lo, lo + rows), pa.int64())
        t = pa.table({
            "id": ids,
            "name": pa.array([f"user-{i % 977}" for i in range(lo, lo + rows)]),
            "score": pa.array([(i * 7919) % 1000 / 10.0 for i in range(lo, lo + rows)]),
            "ts": pa.array([1_700_000_000_000_000 + i * 1000 for i in range(lo, lo + rows)], pa.timestamp("us", tz="UTC")),
        })  # fmt: skip
        pq.write_table(t, folder / f"part-{f:05d}.parquet")
    return files * rows


def have_lakehouse_plugins() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("headrace_cloudfiles", "headrace_delta"))


def delta_rows(path: str) -> int:
    from deltalake import DeltaTable

    return int(DeltaTable(path).to_pyarrow_dataset().count_rows())


def run_headrace(src: Path, out: Path, chk: Path, lakehouse: bool, total: int, per_trigger: int) -> float:
    t0 = time.perf_counter()
    if lakehouse:
        q = (hr.read_stream.format("cloudFiles").option("cloudFiles.format", "parquet")
             .option("cloudFiles.schemaLocation", str(chk / "schema"))
             .option("cloudFiles.maxFilesPerTrigger", per_trigger).load(str(src))
             .write_stream.format("delta").option("checkpointLocation", str(chk))
             .trigger(available_now=True).start(str(out)))  # fmt: skip
    else:
        q = (hr.read_stream.format("rate-micro-batch").option("rowsPerBatch", per_trigger).option("totalRows", total)
             .option("numPartitions", 2).load()
             .write_stream.format("files").option("checkpointLocation", str(chk))
             .trigger(available_now=True).start(str(out)))  # fmt: skip
    q.await_termination()
    return time.perf_counter() - t0


def run_spark(spark: Any, src: Path, out: Path, chk: Path, lakehouse: bool, total: int, per_trigger: int) -> float:
    state = str(chk / "sources" / "0" / "headrace")
    t0 = time.perf_counter()
    if lakehouse:
        df = (spark.readStream.format("headrace.cloudFiles").option("cloudFiles.format", "parquet")
              .option("cloudFiles.schemaLocation", str(chk / "schema"))
              .option("cloudFiles.maxFilesPerTrigger", str(per_trigger))
              .option("headraceStatePath", state).load(str(src)))  # fmt: skip
        w = df.writeStream.format("headrace.delta")
    else:
        df = (spark.readStream.format("headrace.rate-micro-batch").option("rowsPerBatch", str(per_trigger))
              .option("totalRows", str(total)).option("numPartitions", "2").option("headraceStatePath", state).load())  # fmt: skip
        w = df.writeStream.format("headrace.files")
    q = w.option("checkpointLocation", str(chk)).trigger(availableNow=True).start(str(out))
    q.awaitTermination()
    elapsed = time.perf_counter() - t0
    if os.environ.get("HEADRACE_BENCH_VERBOSE"):
        for p in q.recentProgress:
            print(f"  batch {p['batchId']}: {p['numInputRows']} rows, durationMs {p['durationMs']}")
    return elapsed


def start_spark(cores: int) -> Any:
    os.environ.setdefault("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import headrace.spark

    spark = (SparkSession.builder.master(f"local[{cores}]").config("spark.ui.enabled", "false")
             .config("spark.sql.session.timeZone", "UTC").config("spark.driver.memory", "2g").getOrCreate())  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    headrace.spark.register(spark)
    return spark


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=20, help="Parquet files (default 20)")
    ap.add_argument("--rows", type=int, default=50_000, help="rows per file (default 50,000)")
    ap.add_argument("--files-per-trigger", type=int, default=5, help="cloudFiles.maxFilesPerTrigger (default 5)")
    ap.add_argument("--cores", type=int, default=2, help="Spark local[N] (default 2)")
    ap.add_argument("--force-rate", action="store_true", help="bench rate-micro-batch -> files instead")
    args = ap.parse_args()

    lakehouse = have_lakehouse_plugins() and not args.force_rate
    work = Path(tempfile.mkdtemp(prefix="headrace-bench-spark-"))
    try:
        total = args.files * args.rows
        per_trigger = args.files_per_trigger if lakehouse else args.rows * args.files_per_trigger
        if lakehouse:
            write_files(work / "in", args.files, args.rows)
            write_files(work / "warm-in", 2, 1000, offset=10**9)
            pipeline = f"cloudFiles (Parquet, {args.files} files x {args.rows:,} rows) -> delta"
        else:
            pipeline = f"rate-micro-batch ({total:,} rows) -> files (cloudfiles/delta plugins not installed)"
        print(f"pipeline: {pipeline}, availableNow, {args.files_per_trigger} files' worth per trigger")

        t_hr = run_headrace(work / "in", work / "out-hr", work / "chk-hr", lakehouse, total, per_trigger)
        n_hr = delta_rows(str(work / "out-hr")) if lakehouse else hr.connectors.files.read_files(str(work / "out-hr")).num_rows

        t0 = time.perf_counter()
        spark = start_spark(args.cores)
        t_session = time.perf_counter() - t0
        t_warm = run_spark(spark, work / "warm-in", work / "warm-out", work / "warm-chk", lakehouse, 2000, per_trigger)
        t_sp = run_spark(spark, work / "in", work / "out-spark", work / "chk-spark", lakehouse, total, per_trigger)
        n_sp = delta_rows(str(work / "out-spark")) if lakehouse else hr.connectors.files.read_files(str(work / "out-spark")).num_rows
        spark.stop()

        assert n_hr == total and n_sp == total, (n_hr, n_sp, total)
        print(f"headrace alone        : {total / t_hr:>12,.0f} rows/s  ({t_hr:.2f} s)")
        print(f"Spark + headrace.spark: {total / t_sp:>12,.0f} rows/s  ({t_sp:.2f} s; local[{args.cores}], "
              f"session start {t_session:.1f} s and warm-up query {t_warm:.1f} s not counted)")  # fmt: skip
        print(f"ratio Spark / headrace: {t_hr / t_sp:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
