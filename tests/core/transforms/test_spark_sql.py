"""Spark SQL as the expression dialect: translated to DuckDB at definition (and once per input
schema), DuckDB's dialect as a switch, untranslatable functions refused at definition."""

from __future__ import annotations

from typing import Any, cast

import pyarrow as pa
import pytest

import headrace.transforms.spark_sql as spark_sql
from headrace.errors import HeadraceError
from headrace.transforms.expressions import ExpressionError
from headrace.transforms.join import StreamStaticJoinOperator
from headrace.transforms.operator import BatchInfo
from headrace.transforms.spark_sql import current_sql_dialect, sql_dialect, to_duckdb
from headrace.transforms.stateless import SqlOperator, WithColumnOperator, select_expr_query
from headrace.transforms.static import StaticFrame

T = pa.table({"amount": [19.617, -19.617], "name": ["héllo", "ab"], "n": pa.array([3, 4], pa.int32())})


def frame() -> StaticFrame:
    return StaticFrame.from_arrow(T)


def test_spark_is_the_default_dialect() -> None:
    assert current_sql_dialect() == "spark"


@pytest.mark.parametrize(
    ("dialect", "expected"),
    [
        pytest.param("spark", [19, -19], id="spark-truncates"),
        pytest.param("duckdb", [20, -20], id="duckdb-rounds"),
    ],
)
def test_cast_of_a_double_to_bigint_follows_the_dialect(dialect: str, expected: list[int]) -> None:
    with sql_dialect(dialect):
        out = frame().select_expr("CAST(amount AS BIGINT) AS a").to_arrow()
    assert out.column("a").to_pylist() == expected
    assert current_sql_dialect() == "spark"  # the block's dialect is restored after it


@pytest.mark.parametrize(
    ("dialect", "expected"),
    [
        pytest.param("spark", pa.int32(), id="spark-int"),
        pytest.param("duckdb", pa.int64(), id="duckdb-bigint"),
    ],
)
def test_length_type_follows_the_dialect(dialect: str, expected: pa.DataType) -> None:
    with sql_dialect(dialect):
        out = frame().with_column("len", "length(name)").to_arrow()
    assert out.schema.field("len").type == expected
    assert out.column("len").to_pylist() == [5, 2]


def test_the_dialect_is_read_when_the_step_is_defined() -> None:
    with sql_dialect("duckdb"):
        defined = frame().select_expr("CAST(amount AS BIGINT) AS a")
    assert defined.to_arrow().column("a").to_pylist() == [20, -20]


def test_sql_dialect_set_for_the_process_stays_until_changed() -> None:
    previous = sql_dialect("duckdb")
    try:
        assert current_sql_dialect() == "duckdb"
    finally:
        sql_dialect(previous.previous)
    assert current_sql_dialect() == "spark"


@pytest.mark.parametrize("bad", ["postgres", "", None, 3])
def test_an_unknown_dialect_is_refused_naming_it(bad: object) -> None:
    with pytest.raises(HeadraceError, match=r"SQL dialect .* use 'spark' \(the default\) or 'duckdb'"):
        sql_dialect(bad)  # type: ignore[arg-type]


def test_a_pipeline_configuration_chooses_the_dialect() -> None:
    from headrace.pipelines import _context

    token = _context._config.set({"headrace.sql.dialect": "DuckDB"})
    try:
        assert current_sql_dialect() == "duckdb"
        assert frame().select_expr("CAST(amount AS BIGINT) AS a").to_arrow().column("a").to_pylist() == [
            20,
            -20,
        ]
    finally:
        _context._config.reset(token)
    token = _context._config.set({"headrace.sql.dialect": "mysql"})
    try:
        with pytest.raises(
            HeadraceError, match=r"pipeline configuration headrace.sql.dialect: SQL dialect 'mysql'"
        ):
            current_sql_dialect()
    finally:
        _context._config.reset(token)


def test_a_function_with_no_translation_is_refused_at_definition_naming_it() -> None:
    import headrace as hr

    stream = (
        hr.read_stream.format("memory").option("name", "spark_sql_untranslatable").load()
    )  # schema unknown
    with pytest.raises(ExpressionError, match=r"the function no_such_fn\(\) has no translation to DuckDB"):
        stream.select_expr("no_such_fn(amount) AS x")
    with pytest.raises(ExpressionError, match=r"no_such_fn"):
        stream.with_column("x", "no_such_fn(amount)")


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        pytest.param("json_extract_string('{\"a\": 5}', '$.a')", ["5", "5"], id="json_extract_string"),
        pytest.param("n::DOUBLE", [3.0, 4.0], id="double-colon-cast"),
        pytest.param("epoch_ms(0) IS NOT NULL", [True, True], id="epoch_ms"),
        pytest.param("(n // 2)", [1, 2], id="duckdb-integer-division"),
        pytest.param('"amount" > 0', [True, False], id="double-quoted-identifier"),
        pytest.param("`amount` > 0", [True, False], id="backquoted-identifier"),
    ],
)
def test_duckdb_functions_and_spellings_keep_working_in_spark_sql(expr: str, expected: list[object]) -> None:
    assert frame().select_expr(f"{expr} AS v").to_arrow().column("v").to_pylist() == expected


def test_cast_of_binary_to_string_decodes_utf8_in_spark_sql() -> None:
    t = pa.table({"value": pa.array(["héllo".encode(), b"\xff"], pa.binary())})
    out = StaticFrame.from_arrow(t).select_expr("CAST(value AS STRING) AS s").to_arrow()
    assert out.column("s").to_pylist() == ["héllo", None]


def test_an_unaliased_cast_of_a_column_is_named_by_the_column_as_in_spark() -> None:
    """PySpark 4.3: selectExpr("CAST(key AS STRING)", "n::string", "try_cast(t AS INT)",
    "CAST(n + 1 AS STRING)") gives columns key, n, t, CAST((n + 1) AS STRING); a qualified
    column keeps its last part (so Kafka's selectExpr("CAST(value AS STRING)") has ``value``)."""
    t = pa.table({"key": pa.array([b"a"], pa.binary()), "n": [1], "t": ["5"]})
    out = StaticFrame.from_arrow(t).select_expr("CAST(key AS STRING)", "n::string", "try_cast(t AS INT)").to_arrow()
    assert out.to_pylist() == [{"key": "a", "n": "1", "t": 5}]
    assert StaticFrame.from_arrow(t).sql("SELECT CAST(batch.n AS STRING) FROM batch").to_arrow().column_names == ["n"]
    with sql_dialect("duckdb"):  # DuckDB's own names there
        assert StaticFrame.from_arrow(t).select_expr("CAST(n AS BIGINT)").to_arrow().column_names != ["n"]


def test_a_spark_query_in_sql_runs() -> None:
    out = frame().sql("SELECT n div 2 AS h, if(n > 3, 'big', 'small') AS size FROM batch").to_arrow()
    assert out.to_pylist() == [{"h": 1, "size": "small"}, {"h": 2, "size": "big"}]


def test_division_by_zero_raises_as_in_spark() -> None:
    with pytest.raises(ExpressionError, match=r"DIVIDE_BY_ZERO"):
        frame().select_expr("amount / (n - n) AS v").to_arrow()
    with sql_dialect("duckdb"):  # DuckDB's: infinity
        assert frame().select_expr("amount / (n - n) AS v").to_arrow().column("v").to_pylist() == [
            float("inf"),
            float("-inf"),
        ]


def test_translation_happens_at_definition_and_once_per_schema_not_per_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    op = SqlOperator(select_expr_query(["CAST(amount AS BIGINT) AS a"]), what="probe")
    op.output_schema(T.schema)
    calls = []
    real = spark_sql._rewrite
    monkeypatch.setattr(
        spark_sql, "_rewrite", lambda tree, schema: cast(Any, calls.append(schema)) or real(tree, schema)
    )
    for i in range(5):
        assert cast(pa.Table, op.process(T, BatchInfo(i))).column("a").to_pylist() == [19, -19]
    assert calls == []


def test_with_column_translates_the_expression_with_the_input_types() -> None:
    op = WithColumnOperator("amount", "CAST(amount AS INT)")
    assert "TRUNC" in op.query_for(T.schema)
    assert op.output_schema(T.schema).field("amount").type == pa.int32()


def test_the_translation_of_a_text_is_cached() -> None:
    first = to_duckdb("SELECT length(name) FROM batch", what="x", schema=T.schema)
    assert to_duckdb("SELECT length(name) FROM batch", what="x", schema=T.schema) is first


def test_a_join_condition_is_spark_sql() -> None:
    import headrace as hr

    lookup = pa.table({"code": pa.array([19, 20], pa.int64()), "label": ["truncated", "rounded"]})
    stream = hr.read_stream.format("memory").option("name", "spark_sql_join").load()
    joined = stream.join(lookup, on="CAST(batch.amount AS BIGINT) = static.code")
    op = cast(StreamStaticJoinOperator, joined._steps[-1])
    assert op.name == "join(on='CAST(batch.amount AS BIGINT) = static.code', how='inner')"
    out = op._build_query(["amount"], ["code", "label"])
    assert "TRY_CAST" not in out and "CAST(batch.amount AS BIGINT)" in out
    with pytest.raises(ExpressionError, match=r"no_such_fn"):
        stream.join(lookup, on="no_such_fn(batch.amount) = static.code")
