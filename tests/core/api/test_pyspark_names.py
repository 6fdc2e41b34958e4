"""PySpark's spellings of the stream API (camelCase aliases) and ``headrace.functions``: the
same plan as the snake_case / string forms, and Databricks-shaped snippets that run as written
with only the session object changed (``spark = hr``)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pytest

import headrace as hr
from headrace import functions as F
from headrace.errors import HeadraceError
from headrace.testing import memory_stream

SCHEMA = pa.schema([("timestamp", pa.timestamp("us", tz="UTC")), ("key", pa.string()), ("value", pa.string()),
                    ("amount", pa.int64())])  # fmt: skip


def plan(frame: Any) -> list[tuple[str, dict[str, str]]]:
    """A frame's plan as comparable values: each operator's class and public attributes (those
    with a value repr: run-time holders such as event-time statistics left out)."""
    return [(type(op).__name__, {k: repr(v) for k, v in vars(op).items()
                                 if not k.startswith("_") and " object at 0x" not in repr(v)})
            for op in frame._steps]  # fmt: skip


def source(name: str = "pyspark-names") -> hr.StreamFrame:
    return hr.read_stream.format("memory").option("name", name).load()


LOOKUP = pa.table({"lookup_key": ["a", "b"], "lookup_value": ["A", "B"]})

SAME_PLANS = [
    ("selectExpr", lambda s: s.selectExpr("CAST(key AS STRING) AS k", "amount"),
     lambda s: s.select_expr("CAST(key AS STRING) AS k", "amount")),
    ("select_expr-columns", lambda s: s.select_expr(F.col("key"), F.expr("amount * 2 AS a2")),
     lambda s: s.select_expr("key", "amount * 2 AS a2")),
    ("select-col", lambda s: s.select(F.col("key"), "amount"), lambda s: s.select("key", "amount")),
    ("select-expr", lambda s: s.select(F.col("amount").alias("a"), "key"), lambda s: s.select_expr("amount AS a", '"key"')),
    ("where-column", lambda s: s.where((F.col("amount") > 5) & F.col("key").isNotNull()),
     lambda s: s.where("(amount > 5) AND (key IS NOT NULL)")),
    ("filter-column", lambda s: s.filter(F.col("amount") >= F.lit(2)), lambda s: s.where("amount >= 2")),
    ("withColumn-expr", lambda s: s.withColumn("event_key", F.expr("CAST(value AS STRING)")),
     lambda s: s.with_column("event_key", "CAST(value AS STRING)")),
    ("withColumn-arith", lambda s: s.withColumn("x", F.col("amount") * 2 + 1), lambda s: s.with_column("x", "(amount * 2) + 1")),
    ("withColumnRenamed", lambda s: s.withColumnRenamed("key", "k"), lambda s: s.with_column_renamed("key", "k")),
    ("withWatermark", lambda s: s.withWatermark("timestamp", "10 minutes"),
     lambda s: s.with_watermark("timestamp", "10 minutes")),
    ("groupBy-window-agg", lambda s: s.withWatermark("timestamp", "10 minutes")
     .groupBy(F.window(F.col("timestamp"), "1 minute"), F.col("key"))
     .agg(F.count("*").alias("n"), F.sum("amount").alias("total"), F.avg(F.col("amount")), F.min("amount"), F.max("amount")),
     lambda s: s.with_watermark("timestamp", "10 minutes").group_by(hr.window("timestamp", "1 minute"), "key")
     .agg("count(*) AS n", "sum(amount) AS total", "avg(amount)", "min(amount)", "max(amount)")),
    ("groupBy-sliding", lambda s: s.withWatermark("timestamp", "1 minute")
     .groupBy(F.window("timestamp", "1 minute", "30 seconds")).count(),
     lambda s: s.with_watermark("timestamp", "1 minute").group_by(hr.window("timestamp", "1 minute", "30 seconds")).count()),
    ("groupBy-session", lambda s: s.withWatermark("timestamp", "1 minute")
     .groupBy(F.session_window(F.col("timestamp"), "5 minutes"), "key").agg(F.count(F.col("amount"))),
     lambda s: s.with_watermark("timestamp", "1 minute").group_by(hr.session_window("timestamp", "5 minutes"), "key")
     .agg("count(amount)")),
    ("groupBy-list", lambda s: s.groupBy(["key"]).sum("amount"), lambda s: s.group_by("key").agg("sum(amount)")),
    ("groupBy-mean", lambda s: s.groupBy("key").mean("amount"), lambda s: s.group_by("key").agg("avg(amount)")),
    ("dropDuplicates-list", lambda s: s.dropDuplicates(["key", "amount"]), lambda s: s.drop_duplicates("key", "amount")),
    ("dropDuplicates-args", lambda s: s.dropDuplicates("key", "amount"), lambda s: s.drop_duplicates("key", "amount")),
    ("dropDuplicates-all", lambda s: s.dropDuplicates(), lambda s: s.drop_duplicates()),
    ("dropDuplicatesWithinWatermark", lambda s: s.withWatermark("timestamp", "1 minute").dropDuplicatesWithinWatermark(["key"]),
     lambda s: s.with_watermark("timestamp", "1 minute").drop_duplicates_within_watermark("key")),
    ("join-broadcast-expr", lambda s: s.withColumn("event_key", F.expr("CAST(value AS STRING)"))
     .join(F.broadcast(LOOKUP), F.expr("event_key = lookup_key")),
     lambda s: s.with_column("event_key", "CAST(value AS STRING)").join(LOOKUP, on="event_key = lookup_key")),
    ("join-col", lambda s: s.withColumnRenamed("key", "lookup_key").join(F.broadcast(LOOKUP), F.col("lookup_key"), "left"),
     lambda s: s.with_column_renamed("key", "lookup_key").join(LOOKUP, on="lookup_key", how="left")),
    ("from_json", lambda s: s.select(F.from_json(F.col("value"), "a BIGINT, b STRING, c ARRAY<DOUBLE>").alias("j")),
     lambda s: s.select_expr("""from_json(value, '{"a":"BIGINT","b":"VARCHAR","c":["DOUBLE"]}') AS j""")),
    ("lit-string", lambda s: s.withColumn("tag", F.lit("it's")), lambda s: s.with_column("tag", "'it''s'")),
]  # fmt: skip


@pytest.mark.parametrize(("pyspark", "headrace"), [pytest.param(a, b, id=i) for i, a, b in SAME_PLANS])
def test_pyspark_form_gives_the_same_plan(pyspark: Any, headrace: Any) -> None:
    assert plan(pyspark(source())) == plan(headrace(source()))


def test_plans_differ_when_the_expressions_do() -> None:
    """The plan comparison above can fail: a different expression is a different plan."""
    assert plan(source().where(F.col("amount") > 5)) != plan(source().where("amount > 6"))
    assert plan(source().groupBy("key").agg(F.sum("amount"))) != plan(source().group_by("key").agg("max(amount)"))


def test_writer_and_query_aliases_give_the_same_query(tmp_path: Path) -> None:
    s = source()
    camel = (s.writeStream.format("memory").queryName("q").outputMode("update").partitionBy(["key"])
             .trigger(processingTime="5 seconds"))  # fmt: skip
    snake = (s.write_stream.format("memory").query_name("q").output_mode("update").partition_by("key")
             .trigger(processing_time="5 seconds"))  # fmt: skip
    assert repr(camel) == repr(snake) and camel._partition_by == snake._partition_by == ("key",)
    assert camel._trigger == snake._trigger
    assert s.writeStream.trigger(availableNow=True)._trigger == s.write_stream.trigger(available_now=True)._trigger
    fn = lambda t, b: None  # noqa: E731
    assert s.writeStream.foreachBatch(fn)._foreach_batch is fn
    assert hr.readStream is hr.read_stream


def _lookup_snippet(spark: Any, name: str) -> Any:
    """seeds/001's stream-static join snippet, as Databricks wrote it (the Kafka source swapped
    for a memory stream, the sink for memory)."""
    from headrace.functions import broadcast, expr

    lookup = LOOKUP
    return (
        spark.readStream.format("memory").option("name", name).load()
        .withColumn("event_key", expr("CAST(value AS STRING)"))
        .join(broadcast(lookup), expr("event_key = lookup_key"))
        .select("event_key", "lookup_value", "timestamp")
    )  # fmt: skip


def test_databricks_snippet_runs_as_written(tmp_path: Path) -> None:
    name = f"snippet-{uuid.uuid4().hex[:6]}"
    stream = memory_stream(name, SCHEMA)
    t0 = pa.scalar(0, pa.timestamp("us", tz="UTC"))
    stream.add(pa.table({"timestamp": [t0, t0, t0], "key": ["x", "y", "z"], "value": ["a", "c", "b"], "amount": [1, 2, 3]},
                        schema=SCHEMA))  # fmt: skip
    spark = hr
    q = (_lookup_snippet(spark, name).writeStream.format("memory").queryName(name + "-out").outputMode("append")
         .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())  # fmt: skip
    assert q.awaitTermination(60)
    assert not q.isActive
    out = hr.memory_table(name + "-out")
    assert out.column_names == ["event_key", "lookup_value", "timestamp"]
    assert sorted(zip(out["event_key"].to_pylist(), out["lookup_value"].to_pylist(), strict=True)) == [("a", "A"), ("b", "B")]
    assert q.lastProgress == q.last_progress and q.lastProgress["numInputRows"] == 3
    assert q.recentProgress == q.recent_progress and q.runId == q.run_id


def test_grouped_count_with_foreach_batch_runs_as_written(tmp_path: Path) -> None:
    """seeds/000's ``groupBy("customerId").count()`` written with ``foreachBatch`` and
    ``outputMode("complete")``."""
    name = f"snippet-{uuid.uuid4().hex[:6]}"
    schema = pa.schema([("customerId", pa.string()), ("amount", pa.int64())])
    stream = memory_stream(name, schema)
    stream.add(pa.table({"customerId": ["c1", "c2", "c1"], "amount": [1, 2, 3]}, schema=schema))
    seen: dict[int, pa.Table] = {}

    def upsert_to_delta(micro_batch_output_df: pa.Table, batch_id: int) -> None:
        seen[batch_id] = micro_batch_output_df

    spark = hr
    q = (spark.readStream.format("memory").option("name", name).load()
         .groupBy("customerId").count()
         .writeStream.foreachBatch(upsert_to_delta).outputMode("complete")
         .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())  # fmt: skip
    q.awaitTermination()
    rows = sorted(zip(seen[0]["customerId"].to_pylist(), seen[0]["count"].to_pylist(), strict=True))
    assert rows == [("c1", 2), ("c2", 1)]


def test_map_in_arrow_takes_and_yields_record_batches(tmp_path: Path) -> None:
    name = f"snippet-{uuid.uuid4().hex[:6]}"
    schema = pa.schema([("amount", pa.int64())])
    memory_stream(name, schema).add(pa.table({"amount": [1, 2, 3]}, schema=schema))

    def doubled(batches: Any) -> Any:
        import pyarrow.compute as pc

        for b in batches:
            yield pa.RecordBatch.from_arrays([pc.multiply(b.column(0), 2)], names=["doubled"])

    q = (hr.readStream.format("memory").option("name", name).load().mapInArrow(doubled, "doubled BIGINT")
         .writeStream.format("memory").queryName(name + "-out").trigger(availableNow=True).start())  # fmt: skip
    q.awaitTermination(60)
    assert sorted(hr.memory_table(name + "-out")["doubled"].to_pylist()) == [2, 4, 6]


def test_from_json_column_parses_like_the_string_form(tmp_path: Path) -> None:
    name = f"snippet-{uuid.uuid4().hex[:6]}"
    schema = pa.schema([("value", pa.string())])
    memory_stream(name, schema).add(pa.table({"value": ['{"a": 1, "b": "x"}', '{"a": 2}']}, schema=schema))
    q = (hr.readStream.format("memory").option("name", name).load()
         .select(F.from_json("value", "a BIGINT, b STRING").alias("j"))
         .selectExpr("j.a AS a", "j.b AS b")
         .writeStream.format("memory").queryName(name + "-out").trigger(availableNow=True).start())  # fmt: skip
    q.awaitTermination(60)
    out = hr.memory_table(name + "-out")
    assert sorted(zip(out["a"].to_pylist(), out["b"].to_pylist(), strict=True), key=str) == [(1, "x"), (2, None)]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        pytest.param(lambda: F.col(cast(Any, 5)), "col() takes a column name", id="col-not-a-name"),
        pytest.param(lambda: F.expr(""), "expr() takes SQL text", id="expr-empty"),
        pytest.param(lambda: F.lit(object()), "a literal is None, a bool, a number or a string", id="lit-object"),
        pytest.param(lambda: bool(F.col("a") > 1), "has no truth value", id="column-truth-value"),
        pytest.param(lambda: F.window(F.expr("ts + 1"), "1 minute"), "takes a column name or col(name)", id="window-expr"),
        pytest.param(lambda: F.from_json("v", "a NOTATYPE"), "from_json()", id="from-json-bad-schema"),
        pytest.param(lambda: source().dropDuplicates(cast(Any, 5)), "dropDuplicates() takes a list of column names", id="dedup-int"),
        pytest.param(lambda: source().where(cast(Any, 5)), "where() takes SQL text or a headrace.functions Column", id="where-int"),
        pytest.param(lambda: source().groupBy(F.expr("key || 'x'")), "group_by() takes a column name", id="group-by-expr"),
    ],
)  # fmt: skip
def test_bad_pyspark_forms_are_refused_naming_the_fix(build: Any, message: str) -> None:
    with pytest.raises(HeadraceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build()
