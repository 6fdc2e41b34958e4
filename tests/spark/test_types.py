"""Arrow <-> Spark types: the mapping, batch casting, and both directions through Spark."""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import headrace.spark
from headrace.errors import UnsupportedError
from tests.spark._connectors import TYPES_SPEC, bad_table, types_table
from tests.spark._util import files_rows, run_available_now

pytestmark = pytest.mark.spark

EXPECTED_DDL = (
    "struct<i8:tinyint,i16:smallint,i32:int,i64:bigint,u8:smallint,u32:bigint,u64:decimal(20,0),f16:float,"
    "f32:float,f64:double,dec:decimal(10,2),dec256:decimal(20,1),s:string,ls:string,sv:string,b:binary,"
    "lb:binary,fsb:binary,bool:boolean,d32:date,d64:date,ts_ns_tz:timestamp,ts_ms_utc:timestamp,"
    "ts_ntz:timestamp_ntz,dur:interval day to second,lst:array<int>,llst:array<string>,fsl:array<double>,"
    "mp:map<string,bigint>,st:struct<x:smallint,y:string,t:timestamp>,dict:string,nul:void>"
)


def test_arrow_to_spark_schema_maps_every_plugin_type() -> None:
    schema = headrace.spark.arrow_to_spark_schema(types_table().schema)
    assert schema.simpleString() == EXPECTED_DDL
    assert all(f.nullable for f in schema.fields)


def test_conform_batch_gives_exactly_what_spark_accepts() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    table = types_table()
    target = to_arrow_schema(headrace.spark.arrow_to_spark_schema(table.schema), timezone="UTC")
    out = headrace.spark.conform_batch(table.to_batches()[0], target)
    assert out.schema.equals(target)
    assert out.schema.field("ls").type == pa.string()
    assert out.schema.field("ts_ns_tz").type == pa.timestamp("us", tz="UTC")
    row = out.to_pylist()[0]
    assert row["ts_ns_tz"] == dt.datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=dt.UTC)
    assert row["u64"] == decimal.Decimal(18_446_744_073_709_551_615)
    assert row["dict"] == "red"
    # a column the source no longer has is null; one Spark does not know is an error
    narrow = pa.record_batch({"i8": pa.array([1], pa.int8())})
    assert headrace.spark.conform_batch(narrow, target).column("s").to_pylist() == [None]
    with pytest.raises(Exception, match="restart the query"):
        headrace.spark.conform_batch(pa.record_batch({"new_col": [1]}), target)


@pytest.mark.parametrize(
    ("arrow_type", "message"),
    [
        (pa.sparse_union([pa.field("a", pa.int64())]), "Spark has no union type"),
        (pa.month_day_nano_interval(), "calendar intervals are not exchanged"),
        (pa.decimal256(50, 2), "at most 38 digits"),
        (pa.run_end_encoded(pa.int32(), pa.string()), "run-end encoded"),
        (pa.struct([("inner", pa.list_(pa.dense_union([pa.field("x", pa.int8())])))]), r"'c\.inner\[\]'"),
    ],
)
def test_types_spark_cannot_hold_are_clear_errors(arrow_type: pa.DataType, message: str) -> None:
    with pytest.raises(UnsupportedError, match=message) as e:
        headrace.spark.arrow_to_spark_schema(pa.schema([pa.field("c", arrow_type)]))
    assert "fix:" in str(e.value)


def test_spark_types_without_arrow_form_are_clear_errors() -> None:
    from pyspark.sql.types import CalendarIntervalType, StructField, StructType

    with pytest.raises(UnsupportedError, match="cannot be exchanged as Arrow"):
        headrace.spark.spark_to_arrow_schema(StructType([StructField("iv", CalendarIntervalType())]))


def test_every_type_reaches_spark(spark: Any, tmp_path: Path) -> None:
    """A source with every type, read by Spark (with the availableNow fallback: the source has
    no native support) into Spark's memory sink."""
    headrace.spark.register(spark, TYPES_SPEC)
    df = spark.readStream.format("headrace.test-types").option("headraceStatePath", str(tmp_path / "s")).load()
    assert df.schema.simpleString() == EXPECTED_DDL
    q = (df.writeStream.format("memory").queryName("types_out").option("checkpointLocation", str(tmp_path / "c"))
         .trigger(availableNow=True).start())  # fmt: skip
    assert q.awaitTermination(90)
    assert len(q.recentProgress) == 1 and q.recentProgress[0]["numInputRows"] == 2
    rows = spark.table("types_out").collect()
    full = next(r for r in rows if r["i8"] is not None)
    empty = next(r for r in rows if r["i8"] is None)
    assert full["u64"] == decimal.Decimal(18_446_744_073_709_551_615)
    assert full["ls"] == "large" and full["sv"] == "view" and full["fsb"] == bytearray(b"abcd")
    local = dt.datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=dt.UTC).astimezone().replace(tzinfo=None)
    assert full["ts_ns_tz"] == local  # PySpark returns naive local time
    assert full["ts_ntz"] == dt.datetime(2024, 5, 1, 12, 0, 2)
    assert full["dur"] == dt.timedelta(seconds=90, microseconds=5)
    assert full["lst"] == [1, None, 3] and full["fsl"] == [1.0, 2.0] and full["mp"] == {"k": 1}
    assert full["st"]["y"] == "z" and full["dict"] == "red" and full["dec"] == decimal.Decimal("12345.67")
    assert all(v is None for v in empty.asDict().values())


def test_unsupported_source_type_fails_at_load(spark: Any, tmp_path: Path) -> None:
    from pyspark.errors import AnalysisException

    headrace.spark.register(spark, TYPES_SPEC)
    assert bad_table("union").num_rows == 2
    with pytest.raises(AnalysisException, match="column 'u' has Arrow type .*Spark has no union type"):
        spark.readStream.format("headrace.test-types").option("kind", "union").option(
            "headraceStatePath", str(tmp_path / "s")
        ).load()


def test_spark_types_reach_a_headrace_sink(spark: Any, tmp_path: Path) -> None:
    """Spark's types into the files sink: timestamps arrive as UTC whatever the session zone."""
    out = str(tmp_path / "out")
    df = (
        spark.readStream.format("headrace.rate-micro-batch")
        .option("rowsPerBatch", "5").option("totalRows", "5").option("startTimestamp", "1714557600000")
        .option("headraceStatePath", str(tmp_path / "s")).load()
        .selectExpr(
            "value", "timestamp", "cast(value as string) AS s", "cast(value as decimal(10,2)) AS d",
            "array(value, value + 1) AS a", "map('k', value) AS m", "named_struct('x', value, 't', timestamp) AS st",
            "cast(timestamp as date) AS dt", "cast(timestamp as timestamp_ntz) AS ntz", "value % 2 = 0 AS even",
            "cast(cast(value as string) as binary) AS bin", "make_dt_interval(0, 0, 0, value) AS iv",
        )
    )  # fmt: skip
    q = (df.writeStream.format("headrace.files").option("path", out).option("checkpointLocation", str(tmp_path / "c"))
         .trigger(availableNow=True).start())  # fmt: skip
    assert q.awaitTermination(90)
    t = files_rows(out).sort_by("value")
    s = t.schema
    assert s.field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert s.field("ntz").type == pa.timestamp("us")
    assert s.field("d").type == pa.decimal128(10, 2)
    assert s.field("s").type == pa.string() and s.field("bin").type == pa.binary()
    assert s.field("iv").type == pa.duration("us")
    assert pa.types.is_list(s.field("a").type) and pa.types.is_map(s.field("m").type)
    row = t.to_pylist()[3]
    assert row["timestamp"] == dt.datetime(2024, 5, 1, 10, 0, tzinfo=dt.UTC)
    assert row["a"] == [3, 4] and row["m"] == [("k", 3)] and row["st"]["x"] == 3
    assert row["iv"] == dt.timedelta(seconds=3) and row["even"] is False and row["bin"] == b"3"
    assert row["dt"] == dt.date(2024, 5, 1)


def test_available_now_fallback_reads_everything_once(spark: Any, tmp_path: Path) -> None:
    """Same source twice from one checkpoint: the second run finds nothing new."""
    headrace.spark.register(spark, TYPES_SPEC)
    opts = {"headraceStatePath": tmp_path / "s"}
    out, chk = str(tmp_path / "out"), str(tmp_path / "c")
    q = run_available_now(spark, "headrace.test-types", opts, "headrace.files", {"path": out}, chk)
    assert sum(p["numInputRows"] for p in q.recentProgress) == 2
    q2 = run_available_now(spark, "headrace.test-types", opts, "headrace.files", {"path": out}, chk)
    assert sum(p["numInputRows"] for p in q2.recentProgress) == 0
    assert files_rows(out).num_rows == 2
