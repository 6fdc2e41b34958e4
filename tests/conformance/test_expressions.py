"""Spark SQL expressions evaluated by PySpark and by headrace over the same small table (nulls,
negatives, NaN, timestamps at and before the epoch), comparing each result's values and type.

Values are compared per row (timestamps as UTC microseconds, floats to 1e-9 relative, NaN equal
to NaN); types as Spark's ``simpleString`` of the Arrow type headrace returns. The expressions
that fail in Spark (ANSI mode) must fail in headrace, at definition or on the data. One Spark
session (``local[1]``, UTC) for the module: the value cases run as one Spark query.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import sys
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from headrace.errors import HeadraceError
from headrace.transforms.static import StaticFrame

UTC = dt.UTC

TABLE = pa.table({
    "i": pa.array([7, -7, None, 2, 3], pa.int32()),
    "l": pa.array([10_000_000_000, -3, None, 0, 5], pa.int64()),
    "d": pa.array([19.617, -19.617, float("nan"), 0.5, None], pa.float64()),
    "s": pa.array(["Hello World", "  padded  ", None, "", "x,y"], pa.string()),
    "n": pa.array(["42", "-5", None, "007", " 12 "], pa.string()),
    "j": pa.array(['{"a":1,"b":{"c":"x"},"arr":[1,2]}', '{"a":-2.5}', None, "not json", '{"b":{"c":null}}'], pa.string()),
    "ts": pa.array([dt.datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC), dt.datetime(1970, 1, 1, tzinfo=UTC), None,
                    dt.datetime(1969, 12, 31, 23, 59, 59, 500000, tzinfo=UTC), dt.datetime(2024, 1, 1, 12, 30, tzinfo=UTC)],
                   pa.timestamp("us", tz="UTC")),
    "e": pa.array([1_700_000_000, 0, None, -1, 86_400], pa.int64()),
    "csv": pa.array(["a,b,,c", "x", None, "", "1,2"], pa.string()),
    "tss": pa.array(["2024-03-01 10:15:30", "1970-01-01 00:00:00", None, "2023-12-31 23:59:59", "2024-01-01 00:00:00"],
                    pa.string()),
})  # fmt: skip

# (id, Spark SQL expression): the same values and type in both
VALUES = [
    ("cast-double-to-bigint-truncates", "CASE WHEN isnan(d) THEN NULL ELSE CAST(d AS BIGINT) END"),
    ("cast-double-to-int-truncates", "CASE WHEN isnan(d) THEN NULL ELSE CAST(d AS INT) END"),
    ("double-colon-cast", "CASE WHEN isnan(d) THEN NULL ELSE d::INT END"),
    ("cast-int-to-bigint", "CAST(i AS BIGINT)"),
    ("cast-bigint-to-double", "CAST(l AS DOUBLE)"),
    ("cast-int-to-string", "CAST(i AS STRING)"),
    ("cast-string-to-int", "CAST(n AS INT)"),
    ("try-cast-string-to-int", "try_cast(s AS INT)"),
    ("cast-string-to-double", "CAST(n AS DOUBLE)"),
    ("cast-string-to-timestamp", "CAST(tss AS TIMESTAMP)"),
    ("cast-timestamp-to-date", "CAST(ts AS DATE)"),
    ("cast-timestamp-to-string", "CAST(ts AS STRING)"),
    ("cast-double-to-decimal", "CASE WHEN isnan(d) THEN NULL ELSE CAST(d AS DECIMAL(10, 2)) END"),
    ("int-plus-int", "i + i"),
    ("int-times-bigint", "i * l"),
    ("int-minus-literal", "i - 10"),
    ("int-divided-is-double", "i / 2"),
    ("bigint-divided-by-int", "l / i"),
    ("div-is-integer-division", "l div 2"),
    ("remainder-of-negative", "i % 3"),
    ("pmod", "pmod(i, 3)"),
    ("double-arithmetic-nan", "d * 2 + 1"),
    ("unary-minus", "-i"),
    ("abs", "abs(d)"),
    ("round-half-up", "round(d, 1)"),
    ("floor", "floor(d)"),
    ("ceil", "ceil(d)"),
    ("nan-compares-greatest", "d > 100"),
    ("comparison-with-null", "i > 0"),
    ("coalesce", "coalesce(i, -1)"),
    ("nvl", "nvl(s, 'none')"),
    ("case-when", "CASE WHEN i > 0 THEN 'pos' WHEN i < 0 THEN 'neg' ELSE 'other' END"),
    ("if", "if(i > 2, 'big', 'small')"),
    ("is-null", "s IS NULL"),
    ("in-list", "i IN (2, 7)"),
    ("between", "l BETWEEN 0 AND 10"),
    ("length-is-int", "length(s)"),
    ("upper", "upper(s)"),
    ("lower", "lower(s)"),
    ("trim", "trim(s)"),
    ("ltrim", "ltrim(s)"),
    ("substring", "substring(s, 2, 3)"),
    ("substr-negative-start", "substr(s, -3)"),
    ("concat", "concat(s, '-', n)"),
    ("concat-ws-skips-nulls", "concat_ws('|', s, n, csv)"),
    ("instr-is-int", "instr(s, 'o')"),
    ("replace", "replace(s, 'o', '0')"),
    ("lpad", "lpad(n, 5, '0')"),
    ("like", "s LIKE 'H%'"),
    ("rlike", "s RLIKE '^[A-Z]'"),
    ("regexp-extract", "regexp_extract(s, '([A-Z])[a-z]+', 1)"),
    ("split", "split(csv, ',')"),
    ("size-of-split-is-int", "size(split(csv, ','))"),
    ("split-element", "split(csv, ',')[0]"),
    ("get-json-object-scalar", "get_json_object(j, '$.a')"),
    ("get-json-object-nested", "get_json_object(j, '$.b.c')"),
    ("get-json-object-object", "get_json_object(j, '$.b')"),
    ("from-json-ddl-field", "from_json(j, 'a DOUBLE, b STRUCT<c: STRING>').a"),
    ("from-json-nested-field", "from_json(j, 'a DOUBLE, b STRUCT<c: STRING>').b.c"),
    ("struct-field-access", "struct(i AS x, s AS y).y"),
    ("to-json-struct", "to_json(struct(coalesce(i, 0) AS x, 'k' AS y))"),
    ("date-trunc-hour", "date_trunc('HOUR', ts)"),
    ("date-trunc-day", "date_trunc('DAY', ts)"),
    ("to-timestamp", "to_timestamp(tss)"),
    ("to-timestamp-format", "to_timestamp(tss, 'yyyy-MM-dd HH:mm:ss')"),
    ("from-unixtime", "from_unixtime(e)"),
    ("unix-timestamp-of-timestamp", "unix_timestamp(ts)"),
    ("unix-timestamp-of-string", "unix_timestamp(tss)"),
    ("year-is-int", "year(ts)"),
    ("hour-is-int", "hour(ts)"),
    ("to-date", "to_date(tss)"),
    ("date-add", "date_add(CAST(ts AS DATE), 1)"),
    ("current-timestamp-type", "current_timestamp() IS NOT NULL"),
    ("greatest", "greatest(i, 0)"),
    ("sha2", "sha2(s, 256)"),
    ("md5", "md5(s)"),
]

# expressions headrace evaluates differently, as docs/transforms.md "Differences from Spark"
# says: (id, expression, Spark's type, headrace's type, Spark's values, headrace's values)
DIFFERENCES = [
    ("to-json-omits-null-fields", "to_json(struct(i AS x, s AS y))", "string", "string",
     ['{"x":7,"y":"Hello World"}', '{"x":-7,"y":"  padded  "}', "{}", '{"x":2,"y":""}', '{"x":3,"y":"x,y"}'],
     ['{"x":7,"y":"Hello World"}', '{"x":-7,"y":"  padded  "}', '{"x":null,"y":null}', '{"x":2,"y":""}',
      '{"x":3,"y":"x,y"}']),
    ("decimal-division-is-double", "CAST(i AS DECIMAL(10, 2)) / 4", "decimal(14,6)", "double",
     [("dec", "1.75"), ("dec", "-1.75"), None, ("dec", "0.5"), ("dec", "0.75")], [1.75, -1.75, None, 0.5, 0.75]),
]  # fmt: skip

# expressions Spark refuses (ANSI mode): headrace must refuse them too
ERRORS = [
    ("cast-invalid-string-to-int", "CAST(s AS INT)"),
    ("cast-fractional-string-to-int", "CAST('19.6' AS BIGINT)"),
    ("cast-nan-to-int", "CAST(d AS INT)"),
    ("division-by-zero", "i / (i - i)"),
    ("double-division-by-zero", "d / 0"),
    ("remainder-by-zero", "i % 0"),
    ("int-overflow", "i * 2147483647"),
]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """A local[1] Spark session in UTC (the one already running in this process, if any)."""
    os.environ.setdefault("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64")
    os.environ["TZ"] = "UTC"
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import time

    time.tzset()
    from pyspark.sql import SparkSession

    existing = SparkSession.getActiveSession()
    session = existing or (SparkSession.builder.master("local[1]").appName("headrace-expressions")
                           .config("spark.ui.enabled", "false").config("spark.sql.session.timeZone", "UTC")
                           .config("spark.ui.showConsoleProgress", "false").getOrCreate())  # fmt: skip
    session.conf.set("spark.sql.session.timeZone", "UTC")
    yield session
    if existing is None:
        session.stop()


def _spark_type(t: pa.DataType) -> str:
    """An Arrow type as Spark's simpleString."""
    if pa.types.is_struct(t):
        return "struct<" + ",".join(f"{f.name}:{_spark_type(f.type)}" for f in t) + ">"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"array<{_spark_type(t.value_type)}>"
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz else "timestamp_ntz"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    names = {pa.int8(): "tinyint", pa.int16(): "smallint", pa.int32(): "int", pa.int64(): "bigint",
             pa.float32(): "float", pa.float64(): "double", pa.bool_(): "boolean", pa.date32(): "date",
             pa.binary(): "binary"}  # fmt: skip
    return names.get(t, str(t))


def _norm(v: Any) -> Any:
    if isinstance(v, dt.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=UTC)
        return ("ts", round(v.timestamp() * 1_000_000))
    if isinstance(v, Decimal):
        return ("dec", str(v.normalize()))
    if isinstance(v, dict):
        return {k: _norm(x) for k, x in v.items()}
    if hasattr(v, "asDict"):
        return {k: _norm(x) for k, x in v.asDict().items()}
    if isinstance(v, list | tuple):
        return [_norm(x) for x in v]
    return v


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b or abs(a - b) <= 1e-9 * max(abs(a), abs(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(type(a) is type(b) and a == b) or (
        isinstance(a, int | float)
        and isinstance(b, int | float)
        and not isinstance(a, bool)
        and not isinstance(b, bool)
        and a == b
    )


@pytest.fixture(scope="module")
def spark_values(spark: Any) -> dict[str, tuple[str, list[Any]]]:
    """Every value case in one Spark query: id -> (type, values by row)."""
    cases = [(name, e) for name, e in VALUES] + [(d[0], d[1]) for d in DIFFERENCES]
    df = spark.createDataFrame(TABLE).selectExpr(*(f"{e} AS `{name}`" for name, e in cases))
    rows = df.collect()
    return {
        name: (df.schema[name].dataType.simpleString(), [_norm(r[name]) for r in rows]) for name, _ in cases
    }


def test_at_least_sixty_expressions_are_compared() -> None:
    assert len(VALUES) + len(ERRORS) >= 60


@pytest.mark.parametrize(("name", "expression"), VALUES, ids=[n for n, _ in VALUES])
def test_expression_gives_what_spark_gives(name: str, expression: str, spark_values: dict[str, Any]) -> None:
    spark_type, spark_rows = spark_values[name]
    out = StaticFrame.from_arrow(TABLE).select_expr(f"{expression} AS v").to_arrow()
    ours = [_norm(v) for v in out.column("v").to_pylist()]
    assert _spark_type(out.schema.field("v").type) == spark_type, (expression, out.schema.field("v").type)
    assert _same(ours, spark_rows), (expression, ours, spark_rows)


@pytest.mark.parametrize(("name", "expression", "spark_type", "our_type", "spark_rows", "our_rows"), DIFFERENCES,
                         ids=[d[0] for d in DIFFERENCES])  # fmt: skip
def test_documented_difference_from_spark(name: str, expression: str, spark_type: str, our_type: str,
                                          spark_rows: list[Any], our_rows: list[Any],
                                          spark_values: dict[str, Any]) -> None:  # fmt: skip
    """Each pins both sides: it fails once Spark or headrace changes (e.g. once it is fixed)."""
    assert spark_values[name] == (spark_type, spark_rows)
    out = StaticFrame.from_arrow(TABLE).select_expr(f"{expression} AS v").to_arrow()
    assert _spark_type(out.schema.field("v").type) == our_type
    assert [_norm(v) for v in out.column("v").to_pylist()] == our_rows


@pytest.mark.parametrize(("name", "expression"), ERRORS, ids=[n for n, _ in ERRORS])
def test_expression_spark_refuses_is_refused(name: str, expression: str, spark: Any) -> None:
    with pytest.raises(Exception) as spark_error:
        spark.createDataFrame(TABLE).selectExpr(f"{expression} AS v").collect()
    assert not isinstance(spark_error.value, AssertionError)
    with pytest.raises(HeadraceError):
        StaticFrame.from_arrow(TABLE).select_expr(f"{expression} AS v").to_arrow()
