"""Benchmark of headrace.spark. Run from the repo root: ``.venv/bin/python bench/spark.py``.

The same pipeline over the same Parquet files (default 20 files x 50,000 rows = 1M rows), five
files per trigger, trigger availableNow, in ONE local Spark session (``local[2]``):

1. Spark native: ``spark.readStream.format("parquet")`` (schema given, ``maxFilesPerTrigger``)
   -> ``writeStream.format("parquet")``.
2. Spark + adapter: ``spark.readStream.format("headrace.cloudFiles")`` (parquet,
   ``cloudFiles.maxFilesPerTrigger``) -> ``writeStream.format("headrace.files")`` (parquet).
3. headrace alone (no Spark): ``hr.read_stream.format("cloudFiles")`` -> ``format("files")``.
4. The floor (``--no-floor`` skips it): a minimal PySpark Python data source written here
   against PySpark's API alone (list the folder, 5 files per batch, read with pyarrow; write
   one Parquet file per task, no-op commit; no state, staging, fsync or exactly-once
   bookkeeping). It pays what Spark charges any Python data source and nothing else, so it
   is the most a Python data source can reach on this workload: what the adapter loses to it
   is headrace's, the rest is Spark's.

5. A translated query (``--no-query`` skips it): parquet files -> watermark -> windowed count
   -> parquet files, defined with headrace's API and started with ``start(..., engine=spark)``
   (translated once into a PySpark streaming DataFrame), against the same query written
   directly in PySpark (the same adapter formats, ``withWatermark``, ``groupBy(window)``). Both
   run on Spark's engine, so the goal is a ratio >= 0.95; both outputs are checked equal.

Each round runs them once, interleaved (the machine may be shared); after one warm-up round
(not counted) ``--rounds`` rounds (default 3) follow and the medians are printed as rows/s
(rows / wall time from ``readStream`` to the end of ``awaitTermination()``) with the ratios to
Spark native. Every output is checked (row count and id sum). Also printed: the median CPU
seconds of each (this process and its descendants: the JVM and PySpark's Python workers),
which other work on a shared machine disturbs less than wall time, and, for the Spark runs,
the wall time split into the query start (until the first micro-batch starts: for a Python
data source, Spark starts its streaming source runner process then) and the sum of the
micro-batches' ``triggerExecution``.
Fairness: the schema is given to all (Spark's file source needs it; without it cloudFiles
would infer it and add a ``_rescued_data`` column); ``spark.sql.shuffle.partitions`` is the
core count; every Spark setting (Arrow batch size, Python workers) is Spark's default, the
same for all runs. Where the interpreter writes no bytecode (``PYTHONDONTWRITEBYTECODE``),
headrace's sources are compiled first, as pip does for an installed wheel (``--no-compile``
skips it; see ``compile_bytecode``). ``--compiled-pyspark`` makes Spark's Python workers import
the installed pyspark (compiled) instead of ``$SPARK_HOME/python/lib/pyspark.zip``
(tests/spark/_spark_home.py): on a heavily loaded machine a fresh worker compiling pyspark from
the zip misses Spark's fixed 10 s connect-back. ``--verbose`` prints Spark's per-batch durations. The load
average is printed at the start and the end. bench/spark_start.py splits a Python data source's
query start into its steps. Measures; asserts only the outputs. On a loaded machine the figures are indicative only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
import pyarrow.dataset as ds  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from _common import tree_cpu  # noqa: E402

import headrace as hr  # noqa: E402
from headrace.spark import default_max_tasks  # noqa: E402


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


def check(out: Path, total: int, id_sum: int) -> None:
    """Every row exactly once: count and sum of ids of the Parquet files under ``out``."""
    files = [str(p) for p in out.rglob("*.parquet") if "_spark_metadata" not in p.parts and not p.name.startswith(".")]
    t = ds.dataset(files, format="parquet").to_table(columns=["id"])
    got = (t.num_rows, pa.compute.sum(t["id"]).as_py() if t.num_rows else 0)
    assert got == (total, id_sum), f"{out}: {got} != {(total, id_sum)}"


class _FloorMessage:
    """The floor writer's commit message: the file one task wrote."""

    def __init__(self, path: str) -> None:
        self.path = path


def floor_data_source() -> type:
    """The floor: the least a PySpark Python data source can do for this pipeline, written
    straight against PySpark's API (no headrace). Its reader lists the folder once, admits
    ``maxFilesPerTrigger`` files per batch, cuts them into as many tasks as the adapter does
    by default (``headrace.spark.default_max_tasks``: half of Spark's default parallelism) and
    yields each file's record batches with pyarrow; its Arrow writer writes one Parquet file per
    task straight under the output folder, and its commit does nothing. It pays every cost that
    Spark puts on a Python data source (the streaming source runner process, the planner and
    commit round trips, the Arrow <-> row conversions in the JVM) and nothing else: no options
    schema, no file index or state, no staging, no fsync, no exactly-once bookkeeping.
    """
    from pyspark import TaskContext
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceStreamArrowWriter,
        DataSourceStreamReader,
        InputPartition,
        WriterCommitMessage,
    )
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.streaming.datasource import ReadMaxFiles, SupportsTriggerAvailableNow

    class FloorMessage(WriterCommitMessage, _FloorMessage):
        pass

    class FloorReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def __init__(self, path: str, per_trigger: int, tasks: int, schema: Any) -> None:
            self.files = sorted(str(p) for p in Path(path).glob("*.parquet"))
            self.per_trigger, self.tasks = per_trigger, tasks
            self.target = to_arrow_schema(schema, timezone="UTC")
            self.end = len(self.files)

        def initialOffset(self) -> dict:
            return {"i": 0}

        def getDefaultReadLimit(self) -> Any:
            return ReadMaxFiles(self.per_trigger)

        def prepareForTriggerAvailableNow(self) -> None:
            self.end = len(self.files)

        def latestOffset(self, start: dict, limit: Any) -> dict:
            n = limit.max_files if isinstance(limit, ReadMaxFiles) else self.end
            return {"i": min(start["i"] + n, self.end)}

        def partitions(self, start: dict, end: dict) -> list:
            files = self.files[start["i"]:end["i"]]
            k = max(1, min(self.tasks, len(files)))
            return [InputPartition(files[i::k]) for i in range(k)] if files else []

        def read(self, partition: Any) -> Any:
            import pyarrow.parquet as pq

            for f in partition.value:
                for b in pq.ParquetFile(f).iter_batches(batch_size=1 << 20):
                    yield pa.Table.from_batches([b]).cast(self.target).to_batches()[0]

        def commit(self, end: dict) -> None:
            pass

    class FloorWriter(DataSourceStreamArrowWriter):
        def __init__(self, path: str) -> None:
            self.path = path

        def write(self, iterator: Any) -> Any:
            import uuid

            ctx = TaskContext.get()
            assert ctx is not None  # (write runs in a task)
            name = f"{self.path}/part-{ctx.getLocalProperty('streaming.sql.batchId')}-{ctx.partitionId()}-{uuid.uuid4().hex}.parquet"
            os.makedirs(self.path, exist_ok=True)
            writer = None
            for b in iterator:
                if writer is None:
                    writer = pq.ParquetWriter(name, b.schema)
                writer.write_batch(b)
            if writer is not None:
                writer.close()
            return FloorMessage(name)

        def commit(self, messages: Any, batchId: int) -> None:
            pass

    class FloorSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_floor"

        def streamReader(self, schema: Any) -> Any:
            return FloorReader(self.options["path"], int(self.options["maxfilespertrigger"]),
                               int(self.options["tasks"]), schema)  # fmt: skip

        def streamWriter(self, schema: Any, overwrite: bool) -> Any:
            return FloorWriter(self.options["path"])

    return FloorSource


def run_floor(spark: Any, src: Path, out: Path, chk: Path, per_trigger: int, verbose: bool) -> Run:
    schema = spark.read.parquet(str(src)).schema  # given, as to the others
    t0 = time.perf_counter()
    df = (spark.readStream.format("bench_floor").schema(schema).option("maxFilesPerTrigger", str(per_trigger))
          .option("tasks", str(default_max_tasks(spark.sparkContext.defaultParallelism))).load(str(src)))  # fmt: skip
    q = (df.writeStream.format("bench_floor").option("path", str(out)).option("checkpointLocation", str(chk))
         .trigger(availableNow=True).start())  # fmt: skip
    q.awaitTermination()
    return _done(q, t0, "floor", verbose)


def run_native(spark: Any, src: Path, out: Path, chk: Path, per_trigger: int, verbose: bool) -> Run:
    schema = spark.read.parquet(str(src)).schema  # not timed: given, as the adapter's source knows it
    t0 = time.perf_counter()
    df = spark.readStream.format("parquet").schema(schema).option("maxFilesPerTrigger", per_trigger).load(str(src))
    q = (df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(chk))
         .trigger(availableNow=True).start())  # fmt: skip
    q.awaitTermination()
    return _done(q, t0, "native", verbose)


def run_adapter(spark: Any, src: Path, out: Path, chk: Path, per_trigger: int, verbose: bool) -> Run:
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


class Run:
    """One timed run: wall seconds from ``readStream`` to the end of ``awaitTermination()``;
    for Spark, the part before the first micro-batch started (query start: for a Python data
    source, Spark's streaming source runner process) and the sum of the micro-batches'
    ``triggerExecution``."""

    def __init__(self, wall: float, startup: float = 0.0, batches: float = 0.0) -> None:
        self.wall, self.startup, self.batches, self.cpu = wall, startup, batches, 0.0


def _done(q: Any, t0: float, what: str, verbose: bool) -> Run:
    elapsed = time.perf_counter() - t0
    started = time.time() - elapsed  # wall clock at t0
    progress = q.recentProgress
    if verbose:
        for p in progress:
            d = p["durationMs"]
            print(f"  {what} batch {p['batchId']}: {p['numInputRows']} rows, " +
                  ", ".join(f"{k} {v}" for k, v in d.items()))  # fmt: skip
    if not progress:
        return Run(elapsed)
    first = datetime.fromisoformat(progress[0]["timestamp"].replace("Z", "+00:00")).timestamp()
    return Run(elapsed, first - started, sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000)


def run_headrace(src: Path, out: Path, chk: Path, per_trigger: int) -> Run:
    schema = pq.read_schema(next(src.glob("*.parquet")))  # given, as to Spark
    t0 = time.perf_counter()
    q = (hr.read_stream.format("cloudFiles").schema(schema).option("cloudFiles.format", "parquet")
         .option("cloudFiles.schemaLocation", str(chk / "schema"))
         .option("cloudFiles.maxFilesPerTrigger", per_trigger).load(str(src))
         .write_stream.format("files").option("checkpointLocation", str(chk))
         .trigger(available_now=True).start(str(out)))  # fmt: skip
    q.await_termination()
    return Run(time.perf_counter() - t0)


QUERY_WATERMARK, QUERY_WINDOW = "1 second", "10 seconds"


def _query_source_options(chk: Path, per_trigger: int) -> dict[str, str]:
    return {"cloudFiles.format": "parquet", "cloudFiles.schemaLocation": str(chk / "schema"),
            "cloudFiles.maxFilesPerTrigger": str(per_trigger)}  # fmt: skip


def run_translated(spark: Any, src: Path, out: Path, chk: Path, per_trigger: int, verbose: bool) -> Run:
    """The windowed count defined with headrace's API, started on Spark (translated once)."""
    schema = pq.read_schema(next(src.glob("*.parquet")))
    t0 = time.perf_counter()
    q = (hr.read_stream.format("cloudFiles").schema(schema).options(_query_source_options(chk, per_trigger))
         .load(str(src)).with_watermark("ts", QUERY_WATERMARK).group_by(hr.window("ts", QUERY_WINDOW)).count()
         .write_stream.format("files").option("checkpointLocation", str(chk)).trigger(available_now=True)
         .start(str(out), engine=spark))  # fmt: skip
    q.awaitTermination()
    return _done(q, t0, "translated", verbose)


def run_direct(spark: Any, src: Path, out: Path, chk: Path, per_trigger: int, verbose: bool) -> Run:
    """The same windowed count written directly in PySpark (the same adapter formats)."""
    from pyspark.sql import functions as F

    schema = spark.read.parquet(str(src)).schema
    t0 = time.perf_counter()
    df = (spark.readStream.format("headrace.cloudFiles").schema(schema).options(**_query_source_options(chk, per_trigger))
          .load(str(src)).withWatermark("ts", QUERY_WATERMARK).groupBy(F.window("ts", QUERY_WINDOW)).count())  # fmt: skip
    q = (df.writeStream.format("headrace.files").option("path", str(out)).option("checkpointLocation", str(chk))
         .trigger(availableNow=True).start())  # fmt: skip
    q.awaitTermination()
    return _done(q, t0, "direct", verbose)


def window_counts(out: Path) -> list[tuple[Any, int]]:
    """The windowed count's output rows (window start, count), sorted; raises when empty."""
    t = ds.dataset(str(out), format="parquet").to_table()
    rows = sorted((r["window"]["start"], r["count"]) for r in t.to_pylist())
    if not rows:
        raise AssertionError(f"the windowed count wrote no rows to {out}")
    return rows


def compile_bytecode() -> str:
    """Compile headrace's and the cloudFiles plugin's sources to bytecode (``__pycache__``) when
    this interpreter does not write it (``PYTHONDONTWRITEBYTECODE``, as on the machine the
    figures come from). pip compiles an installed wheel; an editable install under that variable
    never is, and then every fresh Python process Spark starts (one per streaming query, see
    docs/spark.md) compiles headrace's modules again: 50-100 ms CPU of the adapter's query start
    that no user installation pays. PySpark and pyarrow in site-packages are compiled already.
    Returns what was done, for the report."""
    if not (sys.flags.dont_write_bytecode or os.environ.get("PYTHONDONTWRITEBYTECODE")):
        return "bytecode: written by the interpreter as usual"
    import compileall

    import headrace_cloudfiles

    dirs = [Path(hr.__file__).parent, Path(headrace_cloudfiles.__file__).parent]
    ok = all(compileall.compile_dir(str(d), quiet=2) for d in dirs)
    return (f"bytecode: compiled {', '.join(d.name for d in dirs)} (PYTHONDONTWRITEBYTECODE is set; "
            f"as pip does for an installed wheel){'' if ok else ' - some files failed to compile'}")  # fmt: skip


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
    ap.add_argument("--no-floor", action="store_true", help="skip the minimal Python data source (the floor)")
    ap.add_argument("--verbose", action="store_true", help="print Spark's per-batch durations")
    ap.add_argument("--no-query", action="store_true", help="skip the translated query against direct PySpark")
    ap.add_argument("--attempts", type=int, default=1,
                    help="run a Spark run again (up to this many times) when a Python worker missed Spark's "
                         "connect-back (a loaded machine); default 1: no retry")  # fmt: skip
    ap.add_argument("--compiled-pyspark", action="store_true",
                    help="Python workers import the installed pyspark (bytecode) instead of $SPARK_HOME/python/lib/"
                         "pyspark.zip (tests/spark/_spark_home.py): on a heavily loaded machine a worker compiling "
                         "pyspark from the zip misses Spark's fixed 10 s connect-back")  # fmt: skip
    ap.add_argument("--no-compile", action="store_true",
                    help="do not compile headrace's sources to bytecode first (see compile_bytecode)")  # fmt: skip
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="headrace-bench-spark-"))
    kinds = ["native", "adapter", "headrace"] + ([] if args.no_floor else ["floor"])
    kinds += [] if args.no_query else ["translated", "direct"]
    label = {"native": "Spark native parquet -> parquet", "adapter": "Spark + headrace.spark adapter",
             "floor": "Spark + minimal Python data source", "headrace": "headrace alone (no Spark)",
             "translated": "query: headrace API on Spark", "direct": "query: written in PySpark"}  # fmt: skip
    try:
        total = write_files(work / "in", args.files, args.rows)
        id_sum = total * (total - 1) // 2
        print(f"pipeline: Parquet ({args.files} files x {args.rows:,} rows) -> Parquet files, availableNow, "
              f"{args.files_per_trigger} files per trigger, local[{args.cores}], one session")  # fmt: skip
        print(compile_bytecode() if not args.no_compile else "bytecode: not compiled first (--no-compile)")
        if args.compiled_pyspark:
            from tests.spark._spark_home import worker_friendly_spark_home

            home = worker_friendly_spark_home() or os.environ.get("SPARK_HOME")
            if home is not None:
                os.environ["SPARK_HOME"] = home
            print(f"Python workers: the installed pyspark, compiled (SPARK_HOME={home})")  # fmt: skip
        print("load average at start: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
        t0 = time.perf_counter()
        spark = start_spark(args.cores)
        if not args.no_floor:
            spark.dataSource.register(floor_data_source())
        print(f"session start {time.perf_counter() - t0:.1f} s (not counted)")
        runs: dict[str, list[Run]] = {k: [] for k in kinds}
        for r in range(args.rounds + 1):
            verbose = args.verbose and r > 0
            got: dict[str, Run] = {}
            for kind in kinds:
                out, chk = work / f"out-{kind}-r{r}", work / f"chk-{kind}-r{r}"
                c0 = tree_cpu()
                if kind == "headrace":
                    run = run_headrace(work / "in", out, chk, args.files_per_trigger)
                else:
                    fn = {"native": run_native, "adapter": run_adapter, "floor": run_floor,
                          "translated": run_translated, "direct": run_direct}[kind]  # fmt: skip
                    for attempt in range(args.attempts):
                        try:
                            run = fn(spark, work / "in", out, chk, args.files_per_trigger, verbose)
                            break
                        except Exception as e:  # Spark's StreamingQueryException
                            if attempt == args.attempts - 1 or "failed to connect back" not in str(e):
                                raise
                            print(f"  {kind}: a Python worker missed Spark's connect-back; run again")
                            shutil.rmtree(out, ignore_errors=True)
                            out, chk = work / f"out-{kind}-r{r}-{attempt + 1}", work / f"chk-{kind}-r{r}-{attempt + 1}"
                            c0 = tree_cpu()
                run.cpu = tree_cpu() - c0
                if kind == "translated":
                    translated_rows = window_counts(out)
                elif kind == "direct":
                    if window_counts(out) != translated_rows:
                        raise AssertionError("the translated query and the PySpark one wrote different counts")
                else:
                    check(out, total, id_sum)
                shutil.rmtree(out, ignore_errors=True)
                got[kind] = run
            if r == 0:
                print("warm-up round (not counted): " + ", ".join(f"{k} {v.wall:.2f} s" for k, v in got.items()))
                continue
            for kind, run in got.items():
                runs[kind].append(run)
        spark.stop()
        print("load average at end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))

        def med(kind: str, attr: str) -> float:
            return statistics.median(getattr(x, attr) for x in runs[kind])

        print(f"medians of {args.rounds} interleaved rounds (every output checked: {total:,} rows, ids summed):")
        for k in kinds:
            w = med(k, "wall")
            walls = " ".join(f"{x.wall:.2f}" for x in runs[k])
            spark_part = f"; start {med(k, 'startup'):.2f} s + batches {med(k, 'batches'):.2f} s" if k != "headrace" else ""
            print(f"  {label[k]:35s} {total / w:>12,.0f} rows/s  ({w:.2f} s; runs {walls}; CPU {med(k, 'cpu'):.2f} s"
                  f"{spark_part})")  # fmt: skip
        n = med("native", "wall")
        print(f"  ratio adapter / Spark native         {n / med('adapter', 'wall'):.2f}   (goal >= 0.8)")
        if "floor" in runs:
            print(f"  ratio minimal Python source / native {n / med('floor', 'wall'):.2f}   (the ceiling of any "
                  "Python data source)")  # fmt: skip
            print(f"  ratio adapter / minimal Python source {med('floor', 'wall') / med('adapter', 'wall'):.2f}   "
                  "(goal >= 0.95: within 5% of the ceiling)")  # fmt: skip
        print(f"  ratio headrace alone / Spark native  {n / med('headrace', 'wall'):.2f}")
        if "translated" in runs:
            print(f"  ratio translated / direct PySpark     {med('direct', 'wall') / med('translated', 'wall'):.2f}   "
                  f"(goal >= 0.95; parquet -> watermark -> {QUERY_WINDOW} windowed count -> parquet)")  # fmt: skip
        cn = med("native", "cpu")
        print(f"  CPU seconds adapter / native         {med('adapter', 'cpu') / cn:.2f}   (JVM + Python workers; "
              "less load-sensitive)")  # fmt: skip
        if "floor" in runs:
            print(f"  CPU seconds minimal source / native  {med('floor', 'cpu') / cn:.2f}")
        sn, sa = med("native", "startup"), med("adapter", "startup")
        bn, ba = med("native", "batches"), med("adapter", "batches")
        print(f"  micro-batches only, adapter / native {bn / ba:.2f}   (sum of triggerExecution: {ba:.2f} s vs {bn:.2f} s;"
              f" query start {sa:.2f} s vs {sn:.2f} s)")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
