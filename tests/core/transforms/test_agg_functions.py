"""Spark's semantics of the aggregate functions where Arrow's differ: ``min``/``max`` order NaN
above every number, and an integer ``sum`` beyond a long raises instead of wrapping. Every
path (bare columns by Arrow's group_by, expressions by DuckDB, chunks combined in a batch,
batches merged into state on both backends, real-time chunks, session windows), checked against
DuckDB (NaN) and against what PySpark 4 gives (overflow: ``ARITHMETIC_OVERFLOW``; NaN: the same
as DuckDB)."""

from __future__ import annotations

import decimal
import math
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from headrace.transforms.agg_functions import SumOverflow, merge_col
from headrace.transforms.agg_partial import group_by
from headrace.transforms.aggregate import AggregateOperator, aggregate_operator
from headrace.transforms.expressions import ExpressionError
from headrace.transforms.operator import BatchInfo, OperatorContext
from headrace.transforms.window import session_window, window
from tests.core.transforms.stateful_harness import run_batches

BACKENDS = ["memory", "rocksdb"]
TS = pa.timestamp("us", tz="UTC")
T0 = 1_700_000_000
NAN = float("nan")
INF = float("inf")
BIG = 2**62
FLOAT = pa.float64()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def table(rows: list[tuple[str, Any]], *, t0: int = 0, v_type: pa.DataType = FLOAT) -> pa.Table:
    """Rows (key, value), one second apart from ``T0 + t0``."""
    return pa.table({"ts": pa.array([(T0 + t0 + i) * 1_000_000 for i in range(len(rows))], pa.int64()).cast(TS),
                     "k": [k for k, _ in rows], "v": pa.array([v for _, v in rows], v_type)})  # fmt: skip


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return bool(a == b)


# ---------------------------------------------------------------------------------------------- NaN

# per key, its values in batch 0 and in batch 1 (None: a null), and Spark's min and max of them
NAN_CASES: dict[str, tuple[list[Any], list[Any], Any, Any]] = {
    "value-nan-one-batch": ([1.0, NAN], [], 1.0, NAN),
    "nan-value-one-batch": ([NAN, 2.0], [], 2.0, NAN),
    "value-then-nan": ([1.0], [NAN], 1.0, NAN),
    "nan-then-value": ([NAN], [-3.0], -3.0, NAN),
    "only-nan": ([NAN], [NAN], NAN, NAN),
    "null-then-nan": ([None], [NAN], NAN, NAN),
    "nan-then-null": ([NAN], [None], NAN, NAN),
    "inf-and-nan": ([INF], [NAN, -INF], -INF, NAN),
    "no-nan": ([5.0, None], [4.0], 4.0, 5.0),
}
NAN_AGGS = {
    "bare-columns": ["min(v) AS lo", "max(v) AS hi"],  # Arrow's group_by
    "expressions": ["min(v * 1) AS lo", "max(v * 1) AS hi"],  # DuckDB
}


def nan_batches() -> list[pa.Table]:
    b0 = [(k, v) for k, (first, _, _, _) in NAN_CASES.items() for v in first]
    b1 = [(k, v) for k, (_, second, _, _) in NAN_CASES.items() for v in second]
    return [table(b0), table(b1, t0=len(b0))]


def check_nan_results(latest: dict[str, dict[str, Any]], batches: list[pa.Table]) -> None:
    con = duckdb.connect()
    con.register("events", pa.concat_tables(batches))
    duck = {r["k"]: r for r in con.sql("SELECT k, min(v) AS lo, max(v) AS hi FROM events GROUP BY k").to_arrow_table()
            .to_pylist()}  # fmt: skip
    assert set(latest) == set(NAN_CASES)
    for k, (_, _, lo, hi) in NAN_CASES.items():
        got = latest[k]
        assert same(got["lo"], lo) and same(got["hi"], hi), (k, got, lo, hi)
        assert same(got["lo"], duck[k]["lo"]) and same(got["hi"], duck[k]["hi"]), (k, got, duck[k])


@pytest.mark.parametrize("aggs", list(NAN_AGGS.values()), ids=list(NAN_AGGS))
@pytest.mark.parametrize("chunks", [1, 3], ids=["one-chunk", "three-chunks"])
@pytest.mark.parametrize("real_time", [False, True], ids=["micro-batch", "real-time"])
def test_min_max_order_nan_above_every_number(backend: str, tmp_path: Path, aggs: list[str], chunks: int,
                                              real_time: bool) -> None:  # fmt: skip
    """Within a chunk, across a batch's chunks and across batches (the state's merge): max is
    NaN when any value is, min only when every non-null value is; as Spark and DuckDB."""
    batches = nan_batches()
    run = run_batches(lambda: AggregateOperator(["k"], aggs), batches, state_path=str(tmp_path), backend=backend,
                      mode="update", chunks=chunks, real_time=real_time)  # fmt: skip
    latest: dict[str, dict[str, Any]] = {}
    for t in run.outputs:
        for r in t.to_pylist() if t is not None else []:
            latest[r["k"]] = r
    check_nan_results(latest, batches)


def test_min_max_with_nan_in_windows_complete_mode(backend: str, tmp_path: Path) -> None:
    """Windows and integer keys (the dense path's shape, which min/max leave to Arrow's
    group_by), complete mode: the same results."""
    batches = nan_batches()
    run = run_batches(lambda: AggregateOperator([window("ts", "1 hour"), "k"], NAN_AGGS["bare-columns"]), batches,
                      state_path=str(tmp_path), backend=backend, mode="complete", chunks=2)  # fmt: skip
    out = run.outputs[-1]
    assert out is not None
    check_nan_results({r["k"]: r for r in out.to_pylist()}, batches)


def test_session_windows_min_max_order_nan_above_every_number(backend: str, tmp_path: Path) -> None:
    """A session's rows split over two batches (merged in Python per session)."""
    batches = nan_batches()
    run = run_batches(lambda: aggregate_operator([session_window("ts", "1 hour"), "k"], NAN_AGGS["bare-columns"]),
                      batches, state_path=str(tmp_path), backend=backend, mode="complete")  # fmt: skip
    out = run.outputs[-1]
    assert out is not None
    rows = out.to_pylist()
    assert len(rows) == len(NAN_CASES)  # one session per key
    check_nan_results({r["k"]: r for r in rows}, batches)


@pytest.mark.parametrize("t", [pa.float64(), pa.float32()], ids=str)
def test_merges_and_group_by_keep_nan_in_max(t: pa.DataType) -> None:
    old = pa.chunked_array([pa.array([1.0, NAN, None, NAN, 2.0], t)])
    new = pa.chunked_array([pa.array([NAN, 1.0, NAN, None, 3.0], t)])
    hi = merge_col("max", old, new).to_pylist()
    lo = merge_col("min", old, new).to_pylist()
    assert all(math.isnan(x) for x in hi[:4]) and hi[4] == 3.0
    assert lo[:2] == [1.0, 1.0] and all(math.isnan(x) for x in lo[2:4]) and lo[4] == 2.0
    g = pa.table({"k": [1, 1, 2, 2, 3], "v": pa.array([1.0, NAN, NAN, NAN, None], t)})
    keys, lo_g, hi_g = group_by(g, ["k"], [("v", "min"), ("v", "max")], {})
    assert keys.to_pylist() == [1, 2, 3]
    assert lo_g.to_pylist()[0] == 1.0 and math.isnan(lo_g.to_pylist()[1]) and lo_g.to_pylist()[2] is None
    assert math.isnan(hi_g.to_pylist()[0]) and math.isnan(hi_g.to_pylist()[1]) and hi_g.to_pylist()[2] is None


# ---------------------------------------------------------------------------------------------- overflow

SUM_AGGS = {
    "bare-column": (["count(*) AS n", "sum(v) AS s"], "sum(v) AS s"),  # Arrow's group_by / direct indexing
    "expression": (["count(*) AS n", "sum(v + 0) AS s"], "sum(v + 0) AS s"),  # DuckDB
    "with-min": (["sum(v) AS s", "max(v) AS hi"], "sum(v) AS s"),  # not every partial adds: get, merge, put
}


def check_overflow(e: pytest.ExceptionInfo[ExpressionError], text: str, batch_id: int) -> None:
    msg = str(e.value)
    assert f"aggregate {text!r} (output column 's')" in msg, msg
    assert f"overflowed bigint in batch {batch_id}" in msg, msg
    assert "ANSI" in msg and "DECIMAL(38, 0)" in msg, msg


@pytest.mark.parametrize("aggs", list(SUM_AGGS.values()), ids=list(SUM_AGGS))
@pytest.mark.parametrize(("values", "chunks"), [([BIG, BIG], 1), ([BIG, BIG], 2), ([-(2**63), -1], 1),
                                                ([BIG, BIG, BIG, BIG, 5], 1)],
                         ids=["one-chunk", "two-chunks", "negative", "wraps-to-a-small-number"])  # fmt: skip
def test_integer_sum_beyond_a_long_raises_within_a_batch(backend: str, tmp_path: Path, aggs: tuple[list[str], str],
                                                          values: list[int], chunks: int) -> None:  # fmt: skip
    """A key's sum over one batch's rows beyond a long: an ExpressionError naming the aggregate,
    its output column and the batch (Spark's default ANSI mode raises ARITHMETIC_OVERFLOW;
    Arrow's sum would wrap to a negative number). Other keys and the first batch are fine."""
    ok = table([("a", 1), ("b", 2)], v_type=pa.int64())
    bad = table([("a", 5), *(("b", v) for v in values)], t0=10, v_type=pa.int64())
    with pytest.raises(ExpressionError) as e:
        run_batches(lambda: AggregateOperator(["k"], aggs[0]), [ok, bad], state_path=str(tmp_path), backend=backend,
                    mode="update", chunks=chunks)  # fmt: skip
    check_overflow(e, aggs[1], 1)


@pytest.mark.parametrize("aggs", list(SUM_AGGS.values()), ids=list(SUM_AGGS))
@pytest.mark.parametrize("new_key", [False, True], ids=["keys-in-state", "with-a-new-key"])
def test_integer_sum_beyond_a_long_raises_across_batches(backend: str, tmp_path: Path, aggs: tuple[list[str], str],
                                                         new_key: bool) -> None:  # fmt: skip
    """The state's total plus the batch's beyond a long (the memory store's in-place add, or
    get/merge/put): raised before anything of the batch is written, so a restart fails the
    same way and the state of the batch before is intact."""
    b0 = table([("a", BIG), ("a", BIG - 1), ("b", 3)], v_type=pa.int64())  # a: 2**63 - 1, the largest long
    b1 = table([("a", 1), ("b", 4), *([("c", 7)] if new_key else [])], t0=10, v_type=pa.int64())
    mk = lambda: AggregateOperator(["k"], aggs[0])  # noqa: E731
    first = run_batches(mk, [b0], state_path=str(tmp_path), backend=backend, mode="update")
    assert first.outputs[0] is not None
    assert {r["k"]: r["s"] for r in first.outputs[0].to_pylist()} == {"a": 2**63 - 1, "b": 3}
    for _ in range(2):  # the run, then a restart: the same error, nothing of batch 1 written
        with pytest.raises(ExpressionError) as e:
            run_batches(mk, [b1], state_path=str(tmp_path), backend=backend, mode="update", run=first)
        check_overflow(e, aggs[1], 1)
        assert not [p for p in tmp_path.rglob("*") if p.parent.name == "changelog" and p.name.split(".")[0] == "1"]
    fixed = table([("a", -1), ("b", 4)], t0=10, v_type=pa.int64())
    again = run_batches(mk, [fixed], state_path=str(tmp_path), backend=backend, mode="update", run=first)
    out = again.outputs[-1]
    assert out is not None
    assert {r["k"]: r["s"] for r in out.to_pylist()} == {"a": 2**63 - 2, "b": 7}


def test_integer_sum_overflow_in_a_window_of_the_dense_shape(backend: str, tmp_path: Path) -> None:
    """Integer keys in one window (direct indexing's shape: its float sums would not be exact,
    so the chunk goes to the checked group_by), and the windows' totals across batches."""
    mk = lambda: AggregateOperator([window("ts", "1 hour"), "k"], ["count(*) AS n", "sum(v) AS s"])  # noqa: E731
    b = pa.table({"ts": pa.array([T0 * 1_000_000] * 4, pa.int64()).cast(TS), "k": pa.array([1, 2, 1, 2]),
                  "v": pa.array([BIG, 1, BIG, 1], pa.int64())})  # fmt: skip
    with pytest.raises(ExpressionError) as e:
        run_batches(mk, [b], state_path=str(tmp_path / "one"), backend=backend, mode="update")
    check_overflow(e, "sum(v) AS s", 0)
    half = b.slice(0, 2)
    with pytest.raises(ExpressionError) as e:
        run_batches(mk, [half, half], state_path=str(tmp_path / "two"), backend=backend, mode="update")
    check_overflow(e, "sum(v) AS s", 1)


def test_integer_sum_overflow_in_real_time_names_the_batch(backend: str, tmp_path: Path) -> None:
    op = AggregateOperator(["k"], ["sum(v) AS s"])
    first = table([("a", BIG), ("a", BIG - 1)], v_type=pa.int64())
    op.output_schema(first.schema)
    op.open(OperatorContext(index=0, state_path=str(tmp_path), state_backend=backend, output_mode="update",
                            real_time=True))  # fmt: skip
    try:
        info = BatchInfo(0, real_time=True)
        op.begin(info)
        out = op.process(first, info)
        assert out is not None and out.column("s").to_pylist() == [2**63 - 1]
        with pytest.raises(ExpressionError) as e:
            op.process(table([("a", 1)], v_type=pa.int64()), info)
        check_overflow(e, "sum(v) AS s", 0)
    finally:
        op.close()


def test_partial_stage_overflow_names_the_batch_begun() -> None:
    """The partial stage (the engine's reader threads) has no batch argument: it names the
    batch the operator began."""
    op = AggregateOperator(["k"], ["sum(v) AS s"])
    t = table([("a", BIG), ("a", BIG)], v_type=pa.int64())
    op.output_schema(t.schema)
    op._batch_id = 12  # what begin() sets
    with pytest.raises(ExpressionError) as e:
        op.partial(t)
    check_overflow(e, "sum(v) AS s", 12)


def test_session_window_sum_overflow(backend: str, tmp_path: Path) -> None:
    mk = lambda: aggregate_operator([session_window("ts", "1 hour"), "k"], ["sum(v) AS s"])  # noqa: E731
    big = table([("a", BIG), ("a", BIG - 1)], v_type=pa.int64())
    with pytest.raises(ExpressionError) as e:  # within the batch (DuckDB's sessions)
        run_batches(mk, [pa.concat_tables([big, table([("a", 1)], t0=5, v_type=pa.int64())])],
                    state_path=str(tmp_path / "one"), backend=backend, mode="complete")  # fmt: skip
    check_overflow(e, "sum(v) AS s", 0)
    with pytest.raises(ExpressionError) as e:  # a session's rows in two batches (merged per session)
        run_batches(mk, [big, table([("a", 1)], t0=5, v_type=pa.int64())], state_path=str(tmp_path / "two"),
                    backend=backend, mode="complete")  # fmt: skip
    check_overflow(e, "sum(v) AS s", 1)


def test_sums_up_to_the_bounds_do_not_raise(backend: str, tmp_path: Path) -> None:
    """The largest and smallest longs are sums like any other; rows whose values are large but
    whose sum is in range (the exact check) are fine; avg of longs is a double (no overflow,
    as in Spark) and count stays exact."""
    b0 = table([("max", BIG), ("max", BIG - 1), ("min", -BIG), ("min", -BIG), ("mixed", BIG), ("mixed", BIG),
                ("mixed", -BIG)], v_type=pa.int64())  # fmt: skip
    b1 = table([("mixed", -BIG), ("mixed", 9)], t0=10, v_type=pa.int64())
    run = run_batches(lambda: AggregateOperator(["k"], ["count(*) AS n", "sum(v) AS s", "avg(v) AS a"]), [b0, b1],
                      state_path=str(tmp_path), backend=backend, mode="complete", chunks=2)  # fmt: skip
    out = run.outputs[-1]
    assert out is not None
    got = {r["k"]: r for r in out.to_pylist()}
    assert {k: r["s"] for k, r in got.items()} == {"max": 2**63 - 1, "min": -(2**63), "mixed": 9}
    assert got["max"]["a"] == pytest.approx((2**63 - 1) / 2) and got["mixed"]["n"] == 5
    big_avg = run_batches(lambda: AggregateOperator(["k"], ["avg(v) AS a", "count(v) AS n"]),
                          [table([("a", BIG)] * 3, v_type=pa.int64())], state_path=str(tmp_path / "avg"),
                          backend=backend, mode="complete")  # fmt: skip
    assert big_avg.outputs[0] is not None
    assert big_avg.outputs[0].to_pylist() == [{"k": "a", "a": 4.611686018427388e18, "n": 3}]  # PySpark's avg


def test_group_by_checks_integer_sums_exactly() -> None:
    """Large values whose group sums are in range pass; one group out of range raises naming
    the partial; the check is skipped when rows times the largest value cannot overflow."""
    t = pa.table({"k": [1, 1, 2, 2], "v": pa.array([BIG, -BIG, 2**63 - 1, 0], pa.int64())})
    keys, s = group_by(t, ["k"], [("v", "sum")], {"v": "p3"})
    assert keys.to_pylist() == [1, 2] and s.to_pylist() == [0, 2**63 - 1]
    bad = pa.table({"k": [1, 1, 2], "v": pa.array([BIG, BIG, 1], pa.int64())})
    with pytest.raises(SumOverflow) as e:
        group_by(bad, ["k"], [("v", "sum")], {"v": "p3"})
    assert e.value.name == "p3"
    wrapped = group_by(bad, ["k"], [("v", "sum")], {})  # (unchecked: Arrow's wrapped sum)
    assert wrapped[1].to_pylist()[0] == -(2**63)
    with pytest.raises(SumOverflow):
        merge_col("add", pa.chunked_array([pa.array([BIG, None])]), pa.chunked_array([pa.array([BIG, 1])]), "p1")
    ok = merge_col("add", pa.chunked_array([pa.array([2**63 - 2, None])]), pa.chunked_array([pa.array([1, 5])]))
    assert ok.to_pylist() == [2**63 - 1, 5]
    u = pa.table({"k": [1, 1], "v": pa.array([2**63, 2**63], pa.uint64())})
    with pytest.raises(SumOverflow):
        group_by(u, ["k"], [("v", "sum")], {"v": "p0"})


def test_a_decimal_sum_is_the_documented_way_past_a_long(backend: str, tmp_path: Path) -> None:
    """The error's advice works: sum(CAST(v AS DECIMAL(38, 0))) sums past a long."""
    b = table([("a", BIG), ("a", BIG), ("a", BIG)], v_type=pa.int64())
    run = run_batches(lambda: AggregateOperator(["k"], ["sum(CAST(v AS DECIMAL(38, 0))) AS s"]), [b, b],
                      state_path=str(tmp_path), backend=backend, mode="update", chunks=3)  # fmt: skip
    out = run.outputs[-1]
    assert out is not None
    assert int(out.column("s").to_pylist()[0]) == 6 * BIG


def test_a_decimal_sum_beyond_its_precision_across_batches_raises(backend: str, tmp_path: Path) -> None:
    nines = pa.table({"k": ["a"], "v": pa.array([decimal.Decimal("9" * 38)], pa.decimal128(38, 0))})
    with pytest.raises(ExpressionError) as e:
        run_batches(lambda: AggregateOperator(["k"], ["sum(v) AS s"]), [nines, nines], state_path=str(tmp_path),
                    backend=backend, mode="update")  # fmt: skip
    msg = str(e.value)
    assert "aggregate 'sum(v) AS s' (output column 's')" in msg and "overflowed decimal(38, 0) in batch 1" in msg
    assert "sum(CAST(v AS DOUBLE))" in msg and "DECIMAL(38, 0)" not in msg
