"""The Arrow fast path: queries compiled to Arrow compute give exactly DuckDB's columns,
types and values; what is outside the subset stays with DuckDB."""

from __future__ import annotations

from typing import cast

import pyarrow as pa
import pytest

from headrace.transforms.arrow_eval import compile_query
from headrace.transforms.expressions import run_sql

T = pa.table({
    "id": pa.array([1, 2, 3, None, 5, -7], pa.int64()),
    "small": pa.array([1, 2, None, 4, 5, 6], pa.int32()),
    "user": pa.array(["a", "Bé", None, "zz", "A", ""], pa.string()),
    "amount": pa.array([1.5, -2.0, 3.25, None, 0.0, 1e9], pa.float64()),
    "flag": pa.array([True, False, None, True, False, True]),
    "ts": pa.array([0, 1, 2, 3, None, 5], pa.timestamp("us", tz="UTC")),
})  # fmt: skip

COMPILED = [
    "SELECT id, user FROM batch",
    "SELECT * FROM batch WHERE id > 1 AND user IS NOT NULL",
    "SELECT * FROM batch WHERE NOT flag OR id = 5",
    "SELECT id + 1 AS a, id * 2 AS b, -id AS c, small + 10 AS d, small - id AS e FROM batch",
    "SELECT upper(user) AS u, lower(user) AS l, user || '-x' AS s FROM batch WHERE user <> 'zz'",
    "SELECT CAST(id AS VARCHAR) AS s, CAST(small AS BIGINT) AS b, CAST(id AS DOUBLE) AS d FROM batch",
    "SELECT coalesce(id, 0) AS c, abs(id) AS a, id IS NULL AS n FROM batch",
    "SELECT *, amount * 1.1 AS more FROM batch WHERE id * 2 > 1",
    "SELECT * REPLACE (id + 100 AS id) FROM batch",
    "SELECT batch.id, true AS t, 'k' AS k, 7 AS seven FROM batch WHERE id >= 2 AND id <= 5",
    "SELECT ts, id FROM batch WHERE flag",
    "SELECT id % 3 AS m, -id % 4 AS n, small % 2 AS s, id % small AS t FROM batch WHERE id % 2 <> 0",
]
DUCKDB_ONLY = [
    "SELECT id / 2 AS h FROM batch",  # DuckDB: float division, NULL on zero
    "SELECT * FROM batch WHERE user LIKE 'a%'",
    "SELECT id * 1.5 AS d FROM batch",  # DECIMAL arithmetic on an integer
    "SELECT CAST(amount AS VARCHAR) AS s FROM batch",  # doubles print differently
    "SELECT id + 1 FROM batch",  # the column's name is DuckDB's rendering
    "SELECT DISTINCT user FROM batch",
    "SELECT count(*) AS n FROM batch",
    "SELECT * FROM batch WHERE id IN (1, 2)",
    "SELECT * FROM batch WHERE ts > '1970-01-01'",
    "WITH x AS (SELECT * FROM batch) SELECT * FROM x",
    "SELECT amount % 2 AS m FROM batch",  # fmod of doubles: left to DuckDB
    "SELECT * FROM batch WHERE amount > 1",  # NaN is greater than any number: not in Arrow
    "SELECT *, amount * 1.1 AS more FROM batch WHERE amount * 1.1 > 1",
]


@pytest.mark.parametrize("query", COMPILED, ids=range(len(COMPILED)))
def test_compiled_queries_give_duckdbs_result(query: str) -> None:
    want = run_sql(T, query)
    fast = compile_query(query, T.schema, want.schema)
    assert fast is not None, "expected this query to be compiled"
    got = fast(T)
    assert got.column_names == want.column_names
    assert got.schema.types == want.schema.types
    assert got.to_pylist() == want.to_pylist()


@pytest.mark.parametrize("query", DUCKDB_ONLY, ids=range(len(DUCKDB_ONLY)))
def test_other_queries_stay_with_duckdb(query: str) -> None:
    assert compile_query(query, T.schema, run_sql(T.slice(0, 0), query).schema) is None


def test_an_overflow_in_a_small_chunk_is_reported_by_duckdb() -> None:
    from headrace.transforms.expressions import ExpressionError
    from headrace.transforms.operator import BatchInfo
    from headrace.transforms.stateless import SqlOperator

    big = pa.table({"x": pa.array([2**62, 1], pa.int64())})
    op = SqlOperator("SELECT x * 4 AS y FROM batch", what="select_expr('x * 4 AS y')")
    op.output_schema(big.schema)
    assert op.fast_for(big.schema) is not None
    with pytest.raises(ExpressionError, match="Overflow"):
        op.process(big, BatchInfo(0))


def test_a_timestamp_duckdb_returns_in_microseconds_is_cast_like_duckdb() -> None:
    t = pa.table({"ts": pa.array([1, 2], pa.timestamp("ms", tz="UTC")), "n": pa.array([1, 2], pa.timestamp("s"))})
    want = run_sql(t, "SELECT ts, n FROM batch")
    fast = compile_query("SELECT ts, n FROM batch", t.schema, want.schema)
    assert fast is not None and fast(t).equals(want)


def test_a_division_by_zero_in_a_remainder_is_reported_by_duckdb() -> None:
    from headrace.transforms.expressions import ExpressionError
    from headrace.transforms.operator import BatchInfo
    from headrace.transforms.stateless import WithColumnOperator

    t = pa.table({"x": pa.array([5, 7], pa.int64()), "d": pa.array([2, 0], pa.int64())})
    op = WithColumnOperator("m", "x % d")
    op.output_schema(t.schema)
    assert op.fast_for(t.schema) is not None
    with pytest.raises(ExpressionError, match="(?i)division by zero"):
        op.process(t, BatchInfo(0))


def test_large_chunks_use_the_compiled_query_too(monkeypatch: pytest.MonkeyPatch) -> None:
    from headrace.transforms import stateless
    from headrace.transforms.operator import BatchInfo

    t = pa.table({"value": pa.array(range(100_000), pa.int64())})
    op = stateless.WithColumnOperator("k", "value % 10000")
    want = op.output_schema(t.schema)
    assert op.fast_for(t.schema) is not None  # compiled at start()

    def no_duckdb(*args: object, **kwargs: object) -> pa.Table:
        raise AssertionError("DuckDB was called for a compiled query")

    monkeypatch.setattr(stateless, "run_sql", no_duckdb)
    got = op.process(t, BatchInfo(0))
    assert got is not None and got.schema == want
    assert got.column("k").to_pylist() == [v % 10000 for v in range(100_000)]


@pytest.mark.parametrize(
    ("values", "divisor", "divisor_type"),
    [
        (list(range(0, 50_000, 7)), 10_000, pa.int32()),
        ([0, 1, 2**63 - 1, 2**62 + 3], 2**63 - 1, pa.int64()),
        ([0, 5, 9], 3, pa.uint16()),
        ([-5, 3, 7], 4, pa.int64()),  # a negative dividend: Arrow's kernel (truncated)
        ([1, None, 3], 2, pa.int8()),  # nulls: Arrow's kernel
    ],
    ids=["bucketing", "int64-extremes", "unsigned-divisor", "negative-dividend", "nulls"],
)
def test_integer_remainder_by_a_constant_matches_arrows_kernel(values: list[int | None], divisor: int,
                                                                divisor_type: pa.DataType) -> None:  # fmt: skip
    import pyarrow.compute as pc

    from headrace.transforms.arrow_eval import _int_remainder

    a = pa.chunked_array([pa.array(values, pa.int64())])
    b = pa.scalar(divisor, divisor_type)
    got, expected = _int_remainder(a, b), pc.remainder_checked(a, b)
    assert got.type == expected.type and got.to_pylist() == expected.to_pylist()


@pytest.mark.parametrize(
    ("condition", "expected"),
    [pytest.param("x > 1", [2.0, float("nan")], id="nan-is-greatest"), pytest.param("x = x", [0.5, 2.0, float("nan")], id="nan-equals-nan")],
)
def test_a_comparison_of_floats_with_nan_gives_spark_and_duckdbs_result(condition: str, expected: list[float]) -> None:
    from headrace.transforms.operator import BatchInfo
    from headrace.transforms.stateless import SqlOperator

    t = pa.table({"x": pa.array([0.5, 2.0, float("nan"), None], pa.float64())})
    op = SqlOperator(f"SELECT * FROM batch WHERE {condition}", what=condition)
    op.output_schema(t.schema)
    got = cast(pa.Table, op.process(t, BatchInfo(0))).column("x").to_pylist()
    assert [repr(v) for v in got] == [repr(v) for v in expected]
