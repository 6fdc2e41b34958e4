"""A headrace query definition run on Spark with one change (``start(..., engine=spark)``):
each supported step gives the rows headrace gives, and the steps Spark cannot take are refused
before the query starts, naming the step."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import headrace as hr
from headrace.errors import HeadraceError, UnsupportedError
from headrace.transforms.operator import Operator

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SCHEMA = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("user", pa.string()), ("amount", pa.int64())])


def _input(tmp_path: Path) -> str:
    """Two parquet files of events (seconds 0..39, users a/b/c, a duplicate per ten rows)."""
    src = tmp_path / "in"
    src.mkdir()
    for part in range(2):
        rows = [
            (T0 + dt.timedelta(seconds=part * 20 + i), "abc"[i % 3], i if i % 10 else 0) for i in range(20)
        ]
        table = pa.table({"ts": [r[0] for r in rows], "user": [r[1] for r in rows], "amount": [r[2] for r in rows]},
                         schema=SCHEMA)  # fmt: skip
        pq.write_table(table, src / f"part-{part}.parquet")
    return str(src)


def _stream(path: str, schema_location: str | None = None) -> Any:
    """The events as a stream of cloudFiles (one file per batch)."""
    opts = {"cloudFiles.format": "parquet", "cloudFiles.maxFilesPerTrigger": "1",
            "cloudFiles.schemaLocation": schema_location or f"{path}-schema"}  # fmt: skip
    return hr.read_stream.format("cloudFiles").options(opts).schema(SCHEMA).load(path)


def _rows(tables: list[pa.Table]) -> list[tuple[Any, ...]]:
    out = []
    for t in tables:
        for r in t.to_pylist():
            out.append(tuple(sorted((k, str(v)) for k, v in r.items())))
    return sorted(out)


_FLAKY = ("failed to connect back", "CANNOT_OPEN_SOCKET")


def _run_both(spark: Any, build: Any, tmp_path: Path, mode: str = "append") -> tuple[list[Any], list[Any]]:
    """The query ``build(stream)`` run to its end on headrace and on Spark (foreach_batch
    collecting tables), each from a stream of its own (own cloudFiles schema location). The
    Spark run starts again from a new checkpoint (up to three times) when a Python worker
    missed Spark's deadline to connect back, which a loaded machine causes."""
    got: dict[str, list[pa.Table]] = {"headrace": [], "spark": []}
    path = _input(tmp_path)
    for name, engine, attempts in (("headrace", None, 1), ("spark", spark, 3)):
        for attempt in range(attempts):
            got[name] = []
            frame = build(_stream(path, str(tmp_path / f"schema-{name}-{attempt}")))
            w = (frame.write_stream.output_mode(mode)
                 .option("checkpointLocation", str(tmp_path / f"chk-{name}-{attempt}"))
                 .trigger(available_now=True).foreach_batch(lambda t, _id, n=name: got[n].append(t)))  # fmt: skip
            q = w.start(engine=engine)
            if engine is None:
                q.await_termination(120)
                assert q.exception() is None, q.exception()
                break
            try:
                assert q.awaitTermination(300), "the Spark query did not finish"
                assert q.exception() is None, q.exception()
                break
            except Exception as e:
                if attempt == attempts - 1 or not any(f in str(e) for f in _FLAKY):
                    raise
            finally:
                q.stop()
    return _rows(got["headrace"]), _rows(got["spark"])


CASES = {
    "where-with_column-select_expr": lambda s: s.where("amount > 3").with_column("double", "amount * 2")
    .select_expr("user", "double", "ts"),
    "sql-drop-rename": lambda s: s.sql("SELECT user, amount, ts, concat(user, '!') AS shout FROM batch")
    .drop("amount").with_column_renamed("shout", "loud"),
    "select-names": lambda s: s.select("user", "amount"),
    "tumbling-window-count": lambda s: s.with_watermark("ts", "5 seconds")
    .group_by(hr.window("ts", "10 seconds")).agg("count(*) AS n", "sum(amount) AS total"),
    "sliding-window-by-user": lambda s: s.with_watermark("ts", "5 seconds")
    .group_by(hr.window("ts", "10 seconds", "5 seconds"), "user").count(),
    "session-window": lambda s: s.where("user = 'a'").with_watermark("ts", "5 seconds")
    .group_by(hr.session_window("ts", "2 seconds"), "user").count(),
    "drop_duplicates": lambda s: s.drop_duplicates("amount").select("amount"),
    "drop_duplicates_within_watermark": lambda s: s.with_watermark("ts", "5 seconds")
    .drop_duplicates_within_watermark("amount").select("amount"),
    "join-static-table": lambda s: s.join(pa.table({"user": ["a", "b"], "name": ["Ann", "Bob"]}), "user"),
    "join-static-left-condition": lambda s: s.join(
        pa.table({"u": ["a"], "vip": [True]}), "batch.user = static.u", how="left").drop("u"),
    "join-static-anti": lambda s: s.join(pa.table({"user": ["a"]}), "user", how="anti"),
    "map_batches-as-mapInArrow": lambda s: s.map_batches(
        lambda t: t.select(["user"]).append_column("len", pa.array([1] * t.num_rows, pa.int64())),
        schema=pa.schema([("user", pa.string()), ("len", pa.int64())])),
    "filter-function": lambda s: s.filter(lambda t: pa.compute.equal(t["user"], "b")),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_step_gives_the_same_rows_on_spark(spark: Any, tmp_path: Path, case: str) -> None:
    ours, theirs = _run_both(spark, CASES[case], tmp_path)
    assert ours, "the query gave no rows: the case tests nothing"
    assert ours == theirs


def test_union_and_complete_mode(spark: Any, tmp_path: Path) -> None:
    def build(s: Any) -> Any:
        other = _stream(str(tmp_path / "in"), str(tmp_path / f"other-{id(s)}"))
        return s.union(other).group_by("user").agg("count(*) AS n")

    ours, theirs = _run_both(spark, build, tmp_path, mode="complete")
    assert ours == theirs and ours


def test_duckdb_dialect_step_is_transpiled(spark: Any, tmp_path: Path) -> None:
    from headrace.transforms.stateless import WithColumnOperator

    step = WithColumnOperator(
        "u", "upper(user) || '-x'", dialect="duckdb"
    )  # as under hr.sql_dialect("duckdb")
    ours, theirs = _run_both(spark, lambda s: s.apply_operator(step).select("u"), tmp_path)
    assert ours == theirs and ("u", "A-x") in [r[0] for r in ours]


def _left(s: Any) -> Any:
    """The join's left side: the events but every fourth amount, watermarked, aliased ``l``."""
    return s.where("amount % 4 != 2").with_watermark("ts", "5 seconds").alias("l")


def _right(o: Any) -> Any:
    """The join's right side: the events renamed, every fourth amount left out, watermarked,
    aliased ``r`` (so each join kind has matched and unmatched rows on both sides)."""
    return (o.select_expr("ts AS rts", "user AS ruser", "amount AS ramount").where("ramount % 4 != 1")
            .with_watermark("rts", "5 seconds").alias("r"))  # fmt: skip


_RANGE = "l.user = r.ruser AND l.ts BETWEEN r.rts - INTERVAL 3 SECONDS AND r.rts + INTERVAL 3 SECONDS"


def _duckdb_join(s: Any, o: Any) -> Any:
    with hr.sql_dialect("duckdb"):  # DuckDB quotes identifiers with double quotes; Spark would read strings
        return _left(s).join(_right(o), '"l"."user" = "r"."ruser" AND l.ts BETWEEN r.rts - INTERVAL 3 SECONDS '
                                        "AND r.rts + INTERVAL 3 SECONDS", how="left")  # fmt: skip


# queries over two streams (the events read twice): stream-stream joins, the union of two
# streams with their own watermarks, and chained stateful operators
TWO_STREAMS = {
    "join-stream-inner-condition": lambda s, o: _left(s).join(_right(o), _RANGE),
    "join-stream-left-outer-duckdb-condition": _duckdb_join,
    "join-stream-right-outer": lambda s, o: _left(s).join(_right(o), _RANGE, how="right"),
    "join-stream-full-outer": lambda s, o: _left(s).join(_right(o), _RANGE, how="full"),
    "join-stream-left-semi": lambda s, o: _left(s).join(_right(o), _RANGE, how="left_semi"),
    "join-stream-keys": lambda s, o: s.select("user", "amount").join(
        o.select_expr("user", "amount AS ramount").where("ramount < 5"), ["user"]),
    "union-two-watermarks": lambda s, o: s.with_watermark("ts", "5 seconds")
    .union(o.with_watermark("ts", "2 seconds")).group_by(hr.window("ts", "10 seconds")).agg("count(*) AS n"),
    "chained-window-window": lambda s, o: s.with_watermark("ts", "5 seconds")
    .group_by(hr.window("ts", "10 seconds")).agg("count(*) AS n")
    .group_by(hr.window("window", "20 seconds")).agg("sum(n) AS total", "count(*) AS windows"),
    "chained-dedup-window": lambda s, o: s.with_watermark("ts", "5 seconds").drop_duplicates("amount", "ts")
    .group_by(hr.window("ts", "10 seconds")).agg("count(*) AS n", "sum(amount) AS total"),
}  # fmt: skip


# run in the deep tier only (HEADRACE_DEEP=1): mirrors and variants of the CI cases, which the
# conformance suite's deep tier also runs three ways
_DEEP_TWO_STREAMS = {"join-stream-right-outer", "join-stream-full-outer", "join-stream-left-semi", "join-stream-keys",
                     "chained-dedup-window"}  # fmt: skip


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c, marks=[pytest.mark.deep] if c in _DEEP_TWO_STREAMS else []) for c in TWO_STREAMS]
)
def test_two_streams_and_chained_operators_give_the_same_rows_on_spark(
    spark: Any, tmp_path: Path, case: str
) -> None:
    def build(s: Any) -> Any:
        other = _stream(str(tmp_path / "in"), str(tmp_path / f"other-{id(s)}"))
        return TWO_STREAMS[case](s, other)

    ours, theirs = _run_both(spark, build, tmp_path)
    assert ours, "the query gave no rows: the case tests nothing"
    assert ours == theirs


class _StateAndTimers(hr.StatefulProcessor):
    """Event time: a count (value state), the batch sizes (list state), the latest amount
    (map state), an event-time timer registered in the first file's batch only (the watermark
    passes it, so it fires in the next batch). ``ttl``: the count's TTL."""

    def __init__(self, ttl: Any = None) -> None:
        self.ttl = ttl

    def init(self, handle: hr.StatefulProcessorHandle) -> None:
        self.count = handle.get_value_state("count", "c BIGINT", ttl=self.ttl)
        self.seen = handle.get_list_state("seen", "n BIGINT")
        self.last = handle.get_map_state("last", "user STRING", "amount BIGINT")

    def handle_input_rows(self, key: tuple[Any, ...], rows: pa.Table, tv: hr.TimerValues) -> Any:
        c = (self.count.get() or (0,))[0] + rows.num_rows
        self.count.update(c)
        self.seen.append_value((rows.num_rows,))
        had = self.last.contains_key(key)
        self.last.update_value(key, {"amount": max(rows.column("amount").to_pylist())})
        if min(rows.column("ts").to_pylist()) < T0 + dt.timedelta(seconds=20):
            self.handle.register_timer(int(min(rows.column("ts").to_pylist()).timestamp() * 1000) + 1000)
        yield {"user": key[0], "kind": "input", "c": c, "seen": len(list(self.seen.get())), "had": had}

    def handle_expired_timer(
        self, key: tuple[Any, ...], tv: hr.TimerValues, info: hr.ExpiredTimerInfo
    ) -> Any:
        yield (key[0], "timer", None, len(list(self.seen.get())), self.last.contains_key(key))


@pytest.mark.timeout(1200)  # Spark's transformWithState: slow under load, retried
def test_transform_with_state_state_and_timers(spark: Any, tmp_path: Path) -> None:
    """transform_with_state translated to transformWithStateInPandas (the headrace processor in
    headrace.spark.stateful's adapter) gives the rows headrace gives: value, list and map state
    kept across batches, an event-time timer fired in the next batch. (Event time, not
    processing time: with processing-time state, Spark's available-now run kept running
    batches and did not end within 300 s here.)"""
    rocksdb = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", rocksdb)
    try:
        ours, theirs = _run_both(spark, lambda s: s.with_watermark("ts", "5 seconds").group_by("user")
            .transform_with_state(_StateAndTimers(), "user STRING, kind STRING, c BIGINT, seen BIGINT, had BOOLEAN",
                                  "append", "event_time"), tmp_path, mode="append")  # fmt: skip
    finally:
        spark.conf.unset("spark.sql.streaming.stateStore.providerClass")
    assert ours == theirs
    kinds = [dict(r)["kind"] for r in ours]
    assert kinds.count("timer") == 3 and kinds.count("input") == 6
    assert {dict(r)["c"] for r in ours if dict(r)["kind"] == "input"} == {"6", "7", "12", "14"}


def test_transform_with_state_ttl_in_event_time_refused_before_start(spark: Any, tmp_path: Path) -> None:
    """Spark allows a TTL only in processing-time mode: the translation runs the processor's
    init on a copy and refuses, naming the variable, before Spark starts anything."""
    frame = (_stream(_input(tmp_path)).with_watermark("ts", "5 seconds").group_by("user")
             .transform_with_state(_StateAndTimers(ttl="1 hour"), "user STRING, kind STRING, c BIGINT, seen BIGINT, "
                                   "had BOOLEAN", "append", "event_time"))  # fmt: skip
    before = len(spark.streams.active)
    with pytest.raises(UnsupportedError, match=r"value state 'count': a TTL needs "
                                               r"time_mode 'processing_time'.*INCORRECT_TIME_MODE_TO_ASSIGN_TTL"):  # fmt: skip
        frame.write_stream.foreach_batch(lambda t, i: None).start(engine=spark)
    assert len(spark.streams.active) == before


@pytest.mark.timeout(1200)  # Spark's transformWithState: slow under load, retried
def test_transform_with_state_initial_state_on_spark(spark: Any, tmp_path: Path) -> None:
    """An initial state (a pyarrow table) reaches handle_initial_state on Spark as on headrace."""

    class Seeded(hr.StatefulProcessor):
        def init(self, handle: hr.StatefulProcessorHandle) -> None:
            self.total = handle.get_value_state("total", "t BIGINT")

        def handle_initial_state(self, key: tuple[Any, ...], initial: pa.Table, tv: hr.TimerValues) -> None:
            self.total.update(sum(initial.column("start").to_pylist()))

        def handle_input_rows(self, key: tuple[Any, ...], rows: pa.Table, tv: hr.TimerValues) -> Any:
            t = (self.total.get() or (0,))[0] + sum(rows.column("amount").to_pylist())
            self.total.update((t,))
            yield pa.table({"user": [key[0]], "total": [t]})

    init = pa.table({"user": ["a", "b"], "start": [1000, 2000]})
    rocksdb = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", rocksdb)
    try:
        ours, theirs = _run_both(spark, lambda s: s.group_by("user").transform_with_state(
            Seeded(), "user STRING, total BIGINT", "update", initial_state=init), tmp_path, mode="update")  # fmt: skip
    finally:
        spark.conf.unset("spark.sql.streaming.stateStore.providerClass")
    assert ours == theirs
    assert any(dict(r)["total"].startswith("10") for r in ours if dict(r)["user"] == "a")


class _Custom(Operator):
    @property
    def name(self) -> str:
        return "custom"

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        return input_schema

    def process(self, table: pa.Table, batch: Any) -> pa.Table:
        return table


def _untranspilable_join(s: Any) -> Any:
    with hr.sql_dialect("duckdb"):  # sqlglot writes no Spark SQL for read_parquet of two files
        return s.alias("l").join(s.select_expr("user AS u", "ts AS rts").alias("r"),
                                 "l.user = r.u AND read_parquet('a', 'b') IS NOT NULL")  # fmt: skip


REFUSED = {
    "map_batches-without-schema": (lambda s: s.map_batches(lambda t: t), "map_batches cannot run on Spark"),
    "custom-operator": (lambda s: s.apply_operator(_Custom()), "step custom cannot run on Spark"),
    "map_batches-without-schema-on-a-union-side": (
        lambda s: s.where("amount > 0").union(s.map_batches(lambda t: t)),
        r"step map_batches cannot run on Spark: \(in the right side of union\(stream\)\) Spark's mapInArrow"),
    "duckdb-join-condition-without-spark-sql": (
        _untranspilable_join,
        r"its DuckDB-dialect join condition .*read_parquet\('a', 'b'\).* does not transpile to Spark SQL"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSED), ids=list(REFUSED))
def test_untranslatable_step_refused_before_start(spark: Any, tmp_path: Path, case: str) -> None:
    build, message = REFUSED[case]
    frame = build(_stream(_input(tmp_path)))
    before = len(spark.streams.active)
    with pytest.raises(UnsupportedError, match=message):
        frame.write_stream.foreach_batch(lambda t, i: None).start(engine=spark)
    assert len(spark.streams.active) == before


def test_engine_only_writer_option_refused(spark: Any, tmp_path: Path) -> None:
    src = _input(tmp_path)
    w = _stream(src).write_stream.format("noop").option("stateStore", "rocksdb")
    with pytest.raises(UnsupportedError, match="stateStore='rocksdb' is headrace's engine's own; on Spark set "
                                               "spark.sql.streaming.stateStore.providerClass"):  # fmt: skip
        w.start(engine=spark)
    w = _stream(src).write_stream.format("noop").option("rocksdbHeldKeysMB", 8)
    with pytest.raises(UnsupportedError, match="rocksdbHeldKeysMB=8 is headrace's engine's own; on Spark set "
                                               r"spark.sql.streaming.stateStore.rocksdb.\*"):  # fmt: skip
        w.start(engine=spark)


def test_engine_must_be_a_spark_session(tmp_path: Path) -> None:
    w = _stream(_input(tmp_path)).write_stream.format("noop")
    with pytest.raises(HeadraceError, match=r"start\(engine=str\): engine is a SparkSession"):
        w.start(engine="spark")


@pytest.mark.parametrize("action", [["show"], ["reset", "--to-batch", "0"]], ids=["show", "reset"])
def test_checkpoint_cli_refuses_a_spark_checkpoint(
    spark: Any, tmp_path: Path, capsys: Any, action: list[str]
) -> None:
    """A translated query leaves Spark's checkpoint; headrace's checkpoint commands say so and
    leave it untouched."""
    from headrace.cli import main

    chk = tmp_path / "chk"
    q = (_stream(_input(tmp_path)).select("user").write_stream.format("noop").option("checkpointLocation", str(chk))
         .trigger(available_now=True).start(engine=spark))  # fmt: skip
    assert q.awaitTermination(120) and q.exception() is None
    before = sorted(p.name for p in (chk / "offsets").iterdir())
    assert before, "Spark wrote no offsets: nothing to refuse"
    assert main(["checkpoint", action[0], str(chk), *action[1:]]) == 1
    err = capsys.readouterr().err
    assert f"checkpoint {chk} is Apache Spark's, not headrace's" in err
    assert "start(..., engine=spark)" in err and "Traceback" not in err
    assert sorted(p.name for p in (chk / "offsets").iterdir()) == before
