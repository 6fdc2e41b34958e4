"""The conformance harness: one query description, run on PySpark Structured Streaming and on
headrace over the same parquet micro-batches, compared batch by batch.

A :class:`QuerySpec` names the steps of a query (:class:`Step`: ``watermark``, ``select_expr``,
``where``, ``with_column``, ``join``, ``group_by``, ``drop_duplicates``,
``drop_duplicates_within_watermark``, ``map_batches``, ``join_stream``: a stream-stream join with
the second input's stream and its own steps) and its output mode; it is rendered to a
PySpark query (:func:`spark_frame`) and to a headrace query (:func:`headrace_frame`). Both read
the same folder of parquet files, one file per trigger (increasing mtimes that agree with the
names, ``maxFilesPerTrigger=1``, an explicit schema), with the available-now trigger, and collect
each batch's output by batch id with ``foreachBatch``. :func:`compare` then reports every
difference: the batch ids run, per batch the rows as multisets (timestamps as UTC
microseconds, floats to 1e-9 relative, NaN equal to NaN), the output's column names and types,
and the progress fields both engines report (``eventTime.watermark``, ``numInputRows``,
``stateOperators[].numRowsTotal/numRowsUpdated/numRowsDroppedByWatermark``).

Used by ``tests/conformance/test_conformance.py`` (fixed seeds, CI) and
``scripts/conformance.py`` (many seeds). A new operator adds a step kind to both renderers; a
Spark engine for headrace would be a third renderer.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tests.conformance.generator import DDL, SCHEMA, STATIC_DDL, Input

__all__ = ["Outcome", "QuerySpec", "Run", "Step", "compare", "headrace_frame", "run_headrace", "run_spark",
           "run_many", "spark_frame", "spark_session", "start_spark", "write_input"]  # fmt: skip

ROOT = Path(__file__).resolve().parents[2]
_JAVA17 = Path("/usr/lib/jvm/java-17-openjdk-amd64")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
PROGRESS_STATE_FIELDS = ("numRowsTotal", "numRowsUpdated", "numRowsDroppedByWatermark")


# ---------------------------------------------------------------------------------------------
# the query description


@dataclass(frozen=True)
class Step:
    """One operator of a query: ``kind`` and its arguments (see :func:`spark_frame`)."""

    kind: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        if self.kind == "union_stream":
            return f"union_stream({' -> '.join(['second', *(s.describe() for s in self.args[0])])})"
        if self.kind == "join_stream":
            right = " -> ".join(["second", *(s.describe() for s in self.args[0])])
            return f"join_stream(({right}), on={self.args[1]!r}, how={self.args[2]!r})"
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.kind}({', '.join(parts)})"


def window(column: str, duration: str, slide: str | None = None) -> tuple[str, ...]:
    """A tumbling (or sliding) window as a ``group_by`` key of a :class:`Step`."""
    return ("window", column, duration, slide) if slide else ("window", column, duration)


def session_window(column: str, gap: str) -> tuple[str, ...]:
    """A session window as a ``group_by`` key of a :class:`Step`."""
    return ("session", column, gap)


@dataclass(frozen=True)
class QuerySpec:
    """A query both engines run: its steps in order, the output mode, whether the stream is
    the union of two sources (the input's ``batches`` and ``second``), and ``conf``: Spark
    session settings the query starts with (``(name, value)`` pairs; headrace gets each as a
    writer option of the same name, e.g. ``spark.sql.streaming.multipleWatermarkPolicy``)."""

    name: str
    steps: tuple[Step, ...]
    mode: str = "append"
    union: bool = False
    conf: tuple[tuple[str, str], ...] = ()

    @property
    def id(self) -> str:
        return f"{self.name}-{self.mode}"

    def describe(self) -> str:
        src = "union(a, b)" if self.union else "files"
        conf = [f"{k}={v}" for k, v in self.conf]
        return " -> ".join([src, *(s.describe() for s in self.steps), f"{self.mode} mode", *conf])


# ---------------------------------------------------------------------------------------------
# input on disk


@dataclass(frozen=True)
class Paths:
    """Where one run's input lives: ``main`` (and ``second``) folders of parquet files, the
    static side's parquet file."""

    main: str
    second: str
    static: str


def _write_files(folder: str, tables: Sequence[pa.Table], base_mtime: float) -> None:
    os.makedirs(folder, exist_ok=True)
    for i, table in enumerate(tables):
        path = os.path.join(folder, f"batch-{i:05d}.parquet")
        pq.write_table(table, path)
        os.utime(path, (base_mtime + i, base_mtime + i))  # Spark orders files by mtime, headrace by name


def write_input(data: Input, folder: str) -> Paths:
    """Write ``data`` under ``folder``: one parquet file per batch, mtimes one second apart in
    name order, in the past (so both engines see every file at the first listing)."""
    base = dt.datetime.now(dt.UTC).timestamp() - 3600
    paths = Paths(
        os.path.join(folder, "in-a"), os.path.join(folder, "in-b"), os.path.join(folder, "static.parquet")
    )
    _write_files(paths.main, data.batches, base)
    _write_files(paths.second, data.second, base)
    pq.write_table(data.static, paths.static)
    return paths


# ---------------------------------------------------------------------------------------------
# map_batches functions: one pyarrow.Table function per name, wrapped for Spark's mapInArrow


def _double_v(table: pa.Table) -> pa.Table:
    import pyarrow.compute as pc

    idx = table.schema.get_field_index("v")
    return table.set_column(idx, "v", pc.multiply(table.column("v"), 2.0))


def _drop_null_keys(table: pa.Table) -> pa.Table:
    import pyarrow.compute as pc

    return table.filter(pc.is_valid(table.column("k")))


MAP_FUNCTIONS: dict[str, Callable[[pa.Table], pa.Table]] = {
    "double_v": _double_v,
    "drop_null_keys": _drop_null_keys,
}


def _for_spark(name: str) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    fn = MAP_FUNCTIONS[name]

    def mapper(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            yield from fn(pa.Table.from_batches([b])).to_batches()

    return mapper


# ---------------------------------------------------------------------------------------------
# rendering


def spark_frame(spark: Any, spec: QuerySpec, paths: Paths) -> Any:
    """The PySpark streaming DataFrame of ``spec`` over ``paths``."""
    from pyspark.sql import functions as F

    def source(folder: str) -> Any:
        return spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).parquet(folder)

    df = source(paths.main)
    if spec.union:
        df = df.union(source(paths.second))
    for step in spec.steps:
        a = step.args
        if step.kind == "watermark":
            df = df.withWatermark(a[0], a[1])
        elif step.kind == "select_expr":
            df = df.selectExpr(*a)
        elif step.kind == "where":
            df = df.where(a[0])
        elif step.kind == "with_column":
            df = df.withColumn(a[0], F.expr(a[1]))
        elif step.kind == "union_stream":  # (the second input's own steps,)
            other = spark_frame(spark, QuerySpec("other", tuple(a[0])), Paths(paths.second, paths.second, paths.static))
            df = df.union(other)
        elif step.kind == "join_stream":  # (right side's steps, on, how), the right side reads `second`
            right = spark_frame(spark, QuerySpec("right", tuple(a[0])), Paths(paths.second, paths.second, paths.static))
            on = a[1]
            df = df.alias("l").join(right.alias("r"), on if isinstance(on, list) else F.expr(on), a[2])
        elif step.kind == "join":
            static = spark.read.schema(STATIC_DDL).parquet(paths.static)
            on = a[0]
            df = df.join(
                F.broadcast(static),
                on if isinstance(on, list) else F.expr(on),
                step.kwargs.get("how", "inner"),
            )
        elif step.kind == "group_by":
            keys = [_spark_key(F, k) for k in a[0]]
            df = df.groupBy(*keys).agg(*(F.expr(x) for x in a[1]))
        elif step.kind == "drop_duplicates":
            df = df.dropDuplicates(list(a)) if a else df.dropDuplicates()
        elif step.kind == "drop_duplicates_within_watermark":
            df = df.dropDuplicatesWithinWatermark(list(a)) if a else df.dropDuplicatesWithinWatermark()
        elif step.kind == "map_batches":
            df = df.mapInArrow(_for_spark(a[0]), df.schema)
        else:
            raise ValueError(f"unknown step kind {step.kind!r}")
    return df


def _spark_key(F: Any, key: Any) -> Any:
    if isinstance(key, str):
        return F.col(key)
    if key[0] == "window":
        return F.window(*key[1:])
    if key[0] == "window_time":  # a window over an earlier windowed aggregation's window column
        return F.window(F.window_time(key[1]), *key[2:])
    if key[0] == "session":
        return F.session_window(key[1], key[2])
    raise ValueError(f"unknown group_by key {key!r}")


def headrace_frame(spec: QuerySpec, paths: Paths, data: Input) -> Any:
    """The headrace ``StreamFrame`` of ``spec`` over ``paths``."""
    import headrace as hr

    def source(folder: str) -> Any:
        return (hr.read_stream.format("cloudFiles").option("cloudFiles.format", "parquet")
                .option("maxFilesPerTrigger", 1).schema(DDL).load(folder))  # fmt: skip

    frame = source(paths.main)
    if spec.union:
        frame = frame.union(source(paths.second))
    for step in spec.steps:
        a = step.args
        if step.kind == "watermark":
            frame = frame.with_watermark(a[0], a[1])
        elif step.kind == "select_expr":
            frame = frame.select_expr(*a)
        elif step.kind == "where":
            frame = frame.where(a[0])
        elif step.kind == "with_column":
            frame = frame.with_column(a[0], a[1])
        elif step.kind == "union_stream":
            other = headrace_frame(QuerySpec("other", tuple(a[0])), Paths(paths.second, paths.second, paths.static),
                                   data)  # fmt: skip
            frame = frame.union(other)
        elif step.kind == "join_stream":
            right = headrace_frame(QuerySpec("right", tuple(a[0])), Paths(paths.second, paths.second, paths.static),
                                   data)  # fmt: skip
            frame = frame.alias("l").join(right.alias("r"), on=a[1], how=a[2])
        elif step.kind == "join":
            frame = frame.join(data.static, on=a[0], how=step.kwargs.get("how", "inner"))
        elif step.kind == "group_by":
            keys = [_headrace_key(hr, k) for k in a[0]]
            frame = frame.group_by(*keys).agg(*a[1])
        elif step.kind == "drop_duplicates":
            frame = frame.drop_duplicates(*a)
        elif step.kind == "drop_duplicates_within_watermark":
            frame = frame.drop_duplicates_within_watermark(*a)
        elif step.kind == "map_batches":
            frame = frame.map_batches(MAP_FUNCTIONS[a[0]], schema=SCHEMA)
        else:
            raise ValueError(f"unknown step kind {step.kind!r}")
    return frame


def _headrace_key(hr: Any, key: Any) -> Any:
    if isinstance(key, str):
        return key
    if key[0] in ("window", "window_time"):  # headrace groups by the window column's time itself
        return hr.window(*key[1:])
    if key[0] == "session":
        return hr.session_window(key[1], key[2])
    raise ValueError(f"unknown group_by key {key!r}")


# ---------------------------------------------------------------------------------------------
# running


@dataclass
class Run:
    """One engine's result: each batch's output table by batch id, and its progress reports."""

    engine: str
    batches: dict[int, pa.Table]
    progress: dict[int, dict[str, Any]]
    seconds: float = 0.0


def _java_home() -> str | None:
    env = os.environ.get("JAVA_HOME")
    if env and (Path(env) / "bin" / "java").exists():
        return env
    if (_JAVA17 / "bin" / "java").exists():
        return str(_JAVA17)
    java = shutil.which("java")
    return str(Path(java).resolve().parents[1]) if java else None


def spark_skip_reason() -> str | None:
    """Why Spark cannot run here (pyspark or Java missing), or None."""
    try:
        import pyspark  # noqa: F401
    except ImportError as e:
        return f"pyspark is not installed ({e}); install it with: pip install 'pyspark>=4.2'"
    if _java_home() is None:
        return "no Java runtime for Spark; install Java 17 (apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
    return None


def spark_session(driver_memory: str = "1g", *, raw_local_files: bool = False) -> Any:
    """A local[2] Spark session in UTC, quiet, 1 shuffle partition; Python workers run this
    interpreter with the repository on their path (for ``map_batches`` functions).
    ``driver_memory`` is the JVM's heap (local mode: the driver runs the tasks too).
    ``raw_local_files``: Hadoop's local file system without its checksum files, and checkpoint
    files written through its ``FileSystem``, less CPU a seed of the catalogue (its queries'
    results are the same); Spark's RocksDB state store
    (``transformWithState``) fails to commit on it, so the CI tier's session keeps the default."""
    java = _java_home()
    assert java is not None, spark_skip_reason()
    os.environ["JAVA_HOME"] = java
    os.environ["TZ"] = "UTC"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    from tests.spark._spark_home import worker_friendly_spark_home

    home = worker_friendly_spark_home()
    if home is not None:
        os.environ["SPARK_HOME"] = home  # workers import pyspark compiled, not from its zip
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    if raw_local_files:
        # local files without Hadoop's checksum layer: each checkpoint file, state delta and log
        # entry is otherwise written and renamed twice (the file and its .crc)
        builder = builder.config("spark.hadoop.fs.file.impl", "org.apache.hadoop.fs.RawLocalFileSystem")
        builder = builder.config("spark.hadoop.fs.AbstractFileSystem.file.impl",
                                 "org.apache.hadoop.fs.local.RawLocalFs")  # fmt: skip
        # checkpoint files through Hadoop's FileSystem rather than its FileContext: without
        # Hadoop's native library, FileContext's rename runs a `readlink` process for each side
        # (three of every four commands the JVM started for a seed's queries)
        builder = builder.config("spark.sql.streaming.checkpointFileManagerClass",
                                 "org.apache.spark.sql.execution.streaming.checkpointing."
                                 "FileSystemBasedCheckpointFileManager")  # fmt: skip
    session = (
        builder.master("local[2]")
        .appName("headrace-conformance")
        .config("spark.ui.enabled", "false")
        # one state partition: the metrics compared are sums over partitions, and each extra
        # partition is another state store to commit every micro-batch
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.streaming.pollingDelay", "10ms")
        .config("spark.python.worker.reuse", "true")
        # a Python worker connecting back to the JVM waits this long (default 15 s); on a loaded
        # 2-core machine it can take longer to start (tests/spark/conftest.py does the same)
        .config("spark.python.authenticate.socketTimeout", "120s")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.ui.showConsoleProgress", "false")
        # every row of a file counts as input (with pushdown, Spark skips row groups a filter
        # rules out and numInputRows counts only the rest)
        .config("spark.sql.parquet.filterPushdown", "false")
        # tiny batches: adaptive planning only adds to Spark's time per batch
        .config("spark.sql.adaptive.enabled", "false")
        # Spark's cost here is fixed work per micro-batch (planning, code generation, task
        # serialisation), not data: whole-stage code generation, the JIT's optimising tier and a
        # parallel collector cost more CPU than they save (a seed of the deep tier: 369 -> 246
        # CPU-seconds; scripts/conformance.py)
        .config("spark.sql.codegen.wholeStage", "false")
        # a static table's broadcast waits for a CPU on a loaded machine (default 300 s)
        .config("spark.sql.broadcastTimeout", "1800")
        # (the first tier alone reserves a 48 MB code cache, which a long session's generated
        # classes fill: then the JIT stops and Spark's tasks fail; so a larger one)
        .config("spark.driver.extraJavaOptions",
                "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=512m")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


class _SparkRun:
    """A Spark query started by :func:`start_spark`; :meth:`result` waits for its end."""

    def __init__(self, spark: Any, spec: QuerySpec, paths: Paths, checkpoint: str) -> None:
        import time

        self.spec = spec
        self.out: dict[int, pa.Table] = {}
        self.started = time.monotonic()
        # a query keeps the session's settings as they are when it starts (Spark clones the
        # session for it), so the spec's own are set for the start only
        before = {k: spark.conf.get(k, None) for k, _ in spec.conf}
        for k, v in spec.conf:
            spark.conf.set(k, v)
        try:
            self.query = (spark_frame(spark, spec, paths).writeStream.foreachBatch(self._collect)
                          .outputMode(spec.mode).option("checkpointLocation", checkpoint)
                          .trigger(availableNow=True).start())  # fmt: skip
        finally:
            for k, old in before.items():
                if old is None:
                    spark.conf.unset(k)
                else:
                    spark.conf.set(k, old)

    def _collect(self, df: Any, batch_id: int) -> None:
        self.out[int(batch_id)] = df.toArrow()

    def result(self, timeout: float = 900) -> Run:
        import time

        q = self.query
        try:
            if not q.awaitTermination(timeout):
                raise AssertionError(f"Spark query {self.spec.id} did not finish within {timeout} s")
            if q.exception() is not None:
                raise AssertionError(f"Spark query {self.spec.id} failed: {q.exception()}")
            progress = {int(p["batchId"]): p for p in q.recentProgress}
        finally:
            q.stop()
        return Run("spark", self.out, progress, time.monotonic() - self.started)


def start_spark(spark: Any, spec: QuerySpec, paths: Paths, checkpoint: str) -> _SparkRun:
    """Start ``spec`` on Spark (available-now, collecting each batch by id); several queries
    run at once in one session, which hides Spark's per-batch latency."""
    return _SparkRun(spark, spec, paths, checkpoint)


def run_spark(spark: Any, spec: QuerySpec, paths: Paths, checkpoint: str, *, timeout: float = 900) -> Run:
    """Run ``spec`` on Spark to the end of its input (available-now), collecting each batch."""
    return start_spark(spark, spec, paths, checkpoint).result(timeout)


def run_headrace(spec: QuerySpec, paths: Paths, data: Input, checkpoint: str, *, timeout: float = 120) -> Run:
    """Run ``spec`` on headrace to the end of its input (available-now), collecting each batch."""
    import time

    out: dict[int, pa.Table] = {}

    def collect(table: pa.Table, batch_id: int) -> None:
        out[int(batch_id)] = table

    started = time.monotonic()
    q = (headrace_frame(spec, paths, data).write_stream.foreach_batch(collect).output_mode(spec.mode)
         .option("checkpointLocation", checkpoint).options(**dict(spec.conf))
         .trigger(available_now=True).start())  # fmt: skip
    try:
        if not q.await_termination(timeout):
            raise AssertionError(f"headrace query {spec.id} did not finish within {timeout} s")
        if q.exception() is not None:
            raise AssertionError(f"headrace query {spec.id} failed: {q.exception()}")
        progress = {int(p["batchId"]): p for p in q.recent_progress}
    finally:
        q.stop()
    return Run("headrace", out, progress, time.monotonic() - started)


# ---------------------------------------------------------------------------------------------
# comparing


def _canon_type(t: pa.DataType) -> str:
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_large_string(t) or pa.types.is_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_large_binary(t) or pa.types.is_binary(t):
        return "binary"
    if pa.types.is_struct(t):
        return "struct<" + ", ".join(f"{f.name}: {_canon_type(f.type)}" for f in t) + ">"
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return f"array<{_canon_type(t.value_type)}>"
    return str(t)


def columns_of(table: pa.Table) -> list[str]:
    """``name: type`` of each column, types named the same for both engines (nullability,
    timestamp units and string widths set aside)."""
    return [f"{f.name}: {_canon_type(f.type)}" for f in table.schema]


def _canon(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return (value - _EPOCH) // dt.timedelta(microseconds=1)
    if isinstance(value, dict):
        return tuple((k, _canon(v)) for k, v in value.items())
    if isinstance(value, list):
        return tuple(_canon(v) for v in value)
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


def _sort_key(value: Any) -> Any:
    """Order any canonical value: None first, then by type name, floats rounded to 6 digits (so
    rows equal to 1e-9 sort next to each other), integers exact."""
    if value is None:
        return (0, "", 0)
    if isinstance(value, tuple):
        return (1, "tuple", tuple(_sort_key(v) for v in value))
    if isinstance(value, bool):
        return (1, "bool", int(value))
    if isinstance(value, int):
        return (1, "num", value)
    if isinstance(value, float):
        return (1, "num", float(f"{value:.6g}"))
    return (1, type(value).__name__, str(value))


def rows_of(table: pa.Table) -> list[tuple[Any, ...]]:
    """The rows of ``table`` as tuples of canonical values, sorted (a multiset)."""
    rows = [tuple(_canon(v) for v in row.values()) for row in table.to_pylist()]
    return sorted(rows, key=lambda r: tuple(_sort_key(v) for v in r))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
            return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
        return False
    return bool(a == b)


def _watermark_ms(progress: Mapping[str, Any]) -> int | None:
    wm = (progress.get("eventTime") or {}).get("watermark")
    if wm is None:
        return None
    if isinstance(wm, int | float):
        return int(wm)
    text = str(wm).replace("Z", "+00:00")
    return int(dt.datetime.fromisoformat(text).timestamp() * 1000)


def progress_fields(progress: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of one batch's progress both engines report, normalised."""
    ops = [{k: op.get(k) for k in PROGRESS_STATE_FIELDS} for op in progress.get("stateOperators") or []]
    return {"watermark_ms": _watermark_ms(progress), "numInputRows": progress.get("numInputRows"),
            "stateOperators": ops}  # fmt: skip


@dataclass
class Outcome:
    """The comparison of one query over one input: ``differences`` empty when identical."""

    spec: QuerySpec
    seed: int
    differences: list[str]
    spark_seconds: float = 0.0
    headrace_seconds: float = 0.0

    @property
    def identical(self) -> bool:
        return not self.differences

    def report(self, limit: int = 12) -> str:
        head = f"{self.spec.id} (seed {self.seed}): " + ("identical" if self.identical else
                                                          f"{len(self.differences)} differences")  # fmt: skip
        lines = [head, f"  query: {self.spec.describe()}"]
        lines += [f"  - {d}" for d in self.differences[:limit]]
        if len(self.differences) > limit:
            lines.append(f"  ... and {len(self.differences) - limit} more")
        return "\n".join(lines)


def _fmt_rows(rows: Sequence[tuple[Any, ...]]) -> str:
    return "[" + ", ".join(repr(r) for r in rows[:6]) + (", ..." if len(rows) > 6 else "") + "]"


def _unmatched(left: list[tuple[Any, ...]], right: list[tuple[Any, ...]]) -> tuple[list[Any], list[Any]]:
    """The rows of each multiset that no row of the other matches (one to one)."""
    rest = list(right)
    only_left = []
    for row in left:
        hit = next((i for i, other in enumerate(rest) if _same(row, other)), None)
        if hit is None:
            only_left.append(row)
        else:
            del rest[hit]
    return only_left, rest


def compare(spec: QuerySpec, seed: int, spark: Run, headrace: Run) -> Outcome:
    """Every difference between the two runs, batch by batch (empty list: identical)."""
    diffs: list[str] = []
    s_ids, h_ids = sorted(spark.batches), sorted(headrace.batches)
    if s_ids != h_ids:
        diffs.append(f"batch ids: spark ran {s_ids}, headrace ran {h_ids}")
    s_cols = next((columns_of(t) for t in spark.batches.values()), None)
    h_cols = next((columns_of(t) for t in headrace.batches.values()), None)
    if s_cols != h_cols:
        diffs.append(f"columns: spark {s_cols}, headrace {h_cols}")
    for b in sorted(set(s_ids) | set(h_ids)):
        s_rows = rows_of(spark.batches[b]) if b in spark.batches else []
        h_rows = rows_of(headrace.batches[b]) if b in headrace.batches else []
        only_s, only_h = _unmatched(s_rows, h_rows)
        if only_s or only_h:
            diffs.append(f"batch {b} rows: {len(s_rows)} on spark, {len(h_rows)} on headrace; "
                         f"only on spark {_fmt_rows(only_s)}, only on headrace {_fmt_rows(only_h)}")  # fmt: skip
        sp, hp = spark.progress.get(b), headrace.progress.get(b)
        if sp is None or hp is None:
            if (sp is None) != (hp is None):
                diffs.append(f"batch {b} progress: only {'headrace' if sp is None else 'spark'} reported one")
            continue
        sf, hf = progress_fields(sp), progress_fields(hp)
        for key in ("watermark_ms", "numInputRows"):
            if sf[key] != hf[key]:
                diffs.append(f"batch {b} {key}: spark {sf[key]}, headrace {hf[key]}")
        if len(sf["stateOperators"]) != len(hf["stateOperators"]):
            diffs.append(f"batch {b} stateOperators: spark {len(sf['stateOperators'])} operators, "
                         f"headrace {len(hf['stateOperators'])}")  # fmt: skip
        for i, (so, ho) in enumerate(zip(sf["stateOperators"], hf["stateOperators"], strict=False)):
            for key in PROGRESS_STATE_FIELDS:
                if so[key] != ho[key]:
                    diffs.append(f"batch {b} stateOperators[{i}].{key}: spark {so[key]}, headrace {ho[key]}")
    return Outcome(spec, seed, diffs, spark.seconds, headrace.seconds)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def run_many(
    spark_session_: Any,
    specs: Sequence[QuerySpec],
    data: Input,
    folder: str | None = None,
    *,
    parallel: int = 8,
) -> list[Outcome]:
    """Write ``data`` once, run every spec on Spark (up to ``parallel`` queries at once) and on
    headrace, compare each pair. Uses a temporary folder unless ``folder`` is given (kept then,
    for a look at the files)."""
    tmp = folder or tempfile.mkdtemp(prefix=f"conformance-{data.seed}-")
    try:
        paths = write_input(data, tmp)
        spark_runs: dict[str, Run] = {}
        failed: dict[str, str] = {}
        for lo in range(0, len(specs), parallel):
            started = [start_spark(spark_session_, spec, paths, os.path.join(tmp, f"chk-spark-{spec.id}"))
                       for spec in specs[lo:lo + parallel]]  # fmt: skip
            for handle in started:
                try:
                    spark_runs[handle.spec.id] = handle.result()
                except Exception as e:  # reported as the case's difference
                    failed[handle.spec.id] = f"spark failed: {_first_line(e)}"
        outcomes = []
        for spec in specs:
            try:
                headrace = run_headrace(spec, paths, data, os.path.join(tmp, f"chk-headrace-{spec.id}"))
            except Exception as e:
                failed[spec.id] = "; ".join(
                    filter(None, [failed.get(spec.id), f"headrace failed: {_first_line(e)}"])
                )
            if spec.id in failed:
                outcomes.append(Outcome(spec, data.seed, [failed[spec.id]]))
            else:
                outcomes.append(compare(spec, data.seed, spark_runs[spec.id], headrace))
        return outcomes
    finally:
        if folder is None:
            shutil.rmtree(tmp, ignore_errors=True)
