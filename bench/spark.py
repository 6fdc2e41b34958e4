"""Benchmark of headrace.spark. Run from the repo root: ``.venv/bin/python bench/spark.py``.

The same pipeline over the same Parquet files (default 20 files x 50,000 rows = 1M rows), five
files per trigger, trigger availableNow, in ONE local Spark session (``local[2]``):

1. Spark native: ``spark.readStream.format("parquet")`` (schema given, ``maxFilesPerTrigger``)
   -> ``writeStream.format("parquet")``.
2. Spark + adapter: ``spark.readStream.format("headrace.cloudFiles")`` (parquet,
   ``cloudFiles.maxFilesPerTrigger``) -> ``writeStream.format("headrace.files")`` (parquet).
3. headrace alone (no Spark): ``hr.read_stream.format("cloudFiles")`` -> ``format("files")``.

Each round runs the three once, interleaved (the machine may be shared); after one warm-up
round (not counted) ``--rounds`` rounds (default 3) follow and the medians are printed as rows/s
(rows / wall time from ``start()`` to the end of ``awaitTermination()``) with the ratios
adapter / native and headrace alone / native. Every output is checked (row count and id sum).
Also printed: the median CPU seconds of each (this process and its descendants: the JVM and
PySpark's Python workers), which other work on a shared machine disturbs less than wall time.
Fairness: the schema is given to all three (Spark's file source needs it; without it
cloudFiles would infer it and add a ``_rescued_data`` column); ``spark.sql.shuffle.partitions``
is the core count; Spark's Arrow and worker settings are its defaults.
``--verbose`` prints Spark's per-batch durations. Measures; asserts only the outputs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
import pyarrow.dataset as ds  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

import headrace as hr  # noqa: E402


def write_files(folder: Path, files: int, rows: int, offset: int = 0) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        lo = offset + f * rows
        t = pa.table({
            "id": pa.array(range(lo, lo + rows), pa.int64()),
            "name": pa.array([f"user-{i % 977}" for i in range(lo, lo + rows)]),
            "score": pa.array([(i * 7919) % 1000 / 10.0 for i in range(lo, lo + rows)]),
            "ts": pa.array([1_700_000_000_000_000 + i * 1000 for i in range(lo, lo + rows)], pa.timestamp("us", tz="UTC")),
        })  # fmt: skip
        pq.write_table(t, folder / f"part-{f:05d}.parquet")
    return files * rows


_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu() -> float:
    """CPU seconds (user + system, reaped children included) of this process and every
    descendant: the JVM, PySpark's daemon and its Python workers. Less sensitive than wall time
    to other work on a shared machine."""
    stats: dict[int, tuple[int, int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(d)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        kids.setdefault(ppid, []).append(pid)
    total, todo = 0, [os.getpid()]
    while todo:
        p = todo.pop()
        total += stats.get(p, (0, 0))[1]
        todo.extend(kids.get(p, []))
    return total / _TICK


def check(out: Path, total: int, id_sum: int) -> None:
    """Every row exactly once: count and sum of ids of the Parquet files under ``out``."""
    files = [str(p) for p in out.rglob("*.parquet") if "_spark_metadata" not in p.parts and not p.name.startswith(".")]
    t = ds.dataset(files, format="parquet").to_table(columns=["id"])
    got = (t.num_rows, pa.compute.sum(t["id"]).as_py() if t.num_rows else 0)
    assert got == (total, id_sum), f"{out}: {got} != {(total, id_sum)}"


def run_native(spark: Any, src: Path, out: Path, chk: Path, per_trigger: int, verbose: bool) -> float:
    schema = spark.read.parquet(str(src)).schema  # not timed: given, as the adapter's source knows it
    t0 = time.perf_counter()
    df = spark.readStream.format("parquet").schema(schema).option("maxFilesPerTrigger", per_trigger).load(str(src))
    q = (df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(chk))
         .trigger(availableNow=True).start())  # fmt: skip
    q.awaitTermination()
    return _done(q, t0, "native", verbose)


def run_adapter(spark: Any, src: Path, out: Path, chk: Path, per_trigger: int, verbose: bool) -> float:
    schema = spark.read.parquet(str(src)).schema  # given, as to Spark's own reader
    t0 = time.perf_counter()
    df = (spark.readStream.format("headrace.cloudFiles").schema(schema).option("cloudFiles.format", "parquet")
          .option("cloudFiles.schemaLocation", str(chk / "schema"))
          .option("cloudFiles.maxFilesPerTrigger", str(per_trigger))
          .option("headraceStatePath", str(chk / "sources" / "0" / "headrace")).load(str(src)))  # fmt: skip
    q = (df.writeStream.format("headrace.files").option("path", str(out)).option("checkpointLocation", str(chk))
         .trigger(availableNow=True).start())  # fmt: skip
    q.awaitTermination()
    return _done(q, t0, "adapter", verbose)


def _done(q: Any, t0: float, what: str, verbose: bool) -> float:
    elapsed = time.perf_counter() - t0
    if verbose:
        for p in q.recentProgress:
            d = p["durationMs"]
            print(f"  {what} batch {p['batchId']}: {p['numInputRows']} rows, " +
                  ", ".join(f"{k} {v}" for k, v in d.items()))  # fmt: skip
    return elapsed


def run_headrace(src: Path, out: Path, chk: Path, per_trigger: int) -> float:
    schema = pq.read_schema(next(src.glob("*.parquet")))  # given, as to Spark
    t0 = time.perf_counter()
    q = (hr.read_stream.format("cloudFiles").schema(schema).option("cloudFiles.format", "parquet")
         .option("cloudFiles.schemaLocation", str(chk / "schema"))
         .option("cloudFiles.maxFilesPerTrigger", per_trigger).load(str(src))
         .write_stream.format("files").option("checkpointLocation", str(chk))
         .trigger(available_now=True).start(str(out)))  # fmt: skip
    q.await_termination()
    return time.perf_counter() - t0


def start_spark(cores: int) -> Any:
    os.environ.setdefault("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import headrace.spark

    spark = (SparkSession.builder.master(f"local[{cores}]").config("spark.ui.enabled", "false")
             .config("spark.sql.session.timeZone", "UTC").config("spark.driver.memory", "2g")
             .config("spark.sql.shuffle.partitions", str(cores)).config("spark.ui.showConsoleProgress", "false").getOrCreate())  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    headrace.spark.register(spark, "cloudFiles", "files")
    return spark


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=20, help="Parquet files (default 20)")
    ap.add_argument("--rows", type=int, default=50_000, help="rows per file (default 50,000)")
    ap.add_argument("--files-per-trigger", type=int, default=5, help="files per trigger (default 5)")
    ap.add_argument("--cores", type=int, default=2, help="Spark local[N] (default 2)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds after the warm-up (default 3)")
    ap.add_argument("--verbose", action="store_true", help="print Spark's per-batch durations")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="headrace-bench-spark-"))
    try:
        total = write_files(work / "in", args.files, args.rows)
        id_sum = total * (total - 1) // 2
        print(f"pipeline: Parquet ({args.files} files x {args.rows:,} rows) -> Parquet files, availableNow, "
              f"{args.files_per_trigger} files per trigger, local[{args.cores}], one session")  # fmt: skip
        t0 = time.perf_counter()
        spark = start_spark(args.cores)
        print(f"session start {time.perf_counter() - t0:.1f} s (not counted)")
        times: dict[str, list[float]] = {"native": [], "adapter": [], "headrace": []}
        cpu: dict[str, list[float]] = {"native": [], "adapter": [], "headrace": []}
        for r in range(args.rounds + 1):
            k = f"r{r}"
            verbose = args.verbose and r > 0
            c0 = tree_cpu()
            tn = run_native(spark, work / "in", work / f"out-native-{k}", work / f"chk-native-{k}",
                            args.files_per_trigger, verbose)  # fmt: skip
            c1 = tree_cpu()
            ta = run_adapter(spark, work / "in", work / f"out-adapter-{k}", work / f"chk-adapter-{k}",
                             args.files_per_trigger, verbose)  # fmt: skip
            c2 = tree_cpu()
            th = run_headrace(work / "in", work / f"out-hr-{k}", work / f"chk-hr-{k}", args.files_per_trigger)
            c3 = tree_cpu()
            for name in ("native", "adapter", "hr"):
                check(work / f"out-{name}-{k}", total, id_sum)
                shutil.rmtree(work / f"out-{name}-{k}", ignore_errors=True)
            if r == 0:
                print(f"warm-up round (not counted): native {tn:.2f} s, adapter {ta:.2f} s, headrace {th:.2f} s")
                continue
            for name, t, c in (("native", tn, c1 - c0), ("adapter", ta, c2 - c1), ("headrace", th, c3 - c2)):
                times[name].append(t)
                cpu[name].append(c)
        spark.stop()
        med = {k: statistics.median(v) for k, v in times.items()}
        label = {"native": "Spark native parquet -> parquet", "adapter": "Spark + headrace.spark adapter",
                 "headrace": "headrace alone (no Spark)"}  # fmt: skip
        print(f"medians of {args.rounds} interleaved rounds (every output checked: {total:,} rows, ids summed):")
        for k in ("native", "adapter", "headrace"):
            runs = " ".join(f"{t:.2f}" for t in times[k])
            print(f"  {label[k]:34s} {total / med[k]:>12,.0f} rows/s  ({med[k]:.2f} s; runs {runs}; "
                  f"CPU {statistics.median(cpu[k]):.2f} s)")  # fmt: skip
        print(f"  ratio adapter / Spark native        {med['native'] / med['adapter']:.2f}   (goal >= 0.8)")
        print(f"  ratio headrace alone / Spark native {med['native'] / med['headrace']:.2f}")
        cn, ca = statistics.median(cpu["native"]), statistics.median(cpu["adapter"])
        print(f"  CPU seconds adapter / native        {ca / cn:.2f}   (JVM + Python workers; less load-sensitive)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
