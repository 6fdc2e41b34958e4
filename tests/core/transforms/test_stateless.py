"""Stateless operators: each one run by the engine over a stream, checked against the same
query run by DuckDB over all the input at once; expression errors before any data is read."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import headrace as hr
from headrace.errors import HeadraceError
from headrace.testing import memory_stream
from headrace.transforms.expressions import ExpressionError

SCHEMA = pa.schema([("id", pa.int64()), ("user", pa.string()), ("amount", pa.float64()), ("body", pa.string())])
_names = itertools.count()


def make_input(batches: int = 4, rows: int = 50) -> tuple[str, pa.Table]:
    """A memory stream of ``batches`` tables, and all of its rows as one table."""
    name = f"in-{next(_names)}-{uuid.uuid4().hex[:6]}"
    stream = memory_stream(name, SCHEMA)
    tables = []
    for b in range(batches):
        ids = list(range(b * rows, (b + 1) * rows))
        t = pa.table({
            "id": ids,
            "user": [None if i % 7 == 0 else f"u{i % 5}" for i in ids],
            "amount": [float(i % 13) - 3.5 for i in ids],
            "body": [f'{{"amount": {i % 9}, "tag": "t{i % 3}"}}' if i % 4 else None for i in ids],
        }, schema=SCHEMA)  # fmt: skip
        stream.add(t)
        tables.append(t)
    return name, pa.concat_tables(tables)


def run(frame: hr.StreamFrame, tmp_path: Path) -> pa.Table:
    out = f"out-{uuid.uuid4().hex[:8]}"
    q = (frame.write_stream.format("memory").query_name(out).option("checkpointLocation", str(tmp_path / out))
         .trigger(available_now=True).start())  # fmt: skip
    assert q.await_termination(60)
    return hr.memory_table(out)


def duck(table: pa.Table, query: str) -> pa.Table:
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.register("batch", table)
    return con.sql(query).to_arrow_table()


def rows(t: pa.Table) -> list[tuple[Any, ...]]:
    return sorted((tuple(r.values()) for r in t.to_pylist()), key=repr)


STREAM_STEPS: list[tuple[str, Callable[[hr.StreamFrame], hr.StreamFrame], str]] = [
    ("select_expr",
     lambda s: s.select_expr("CAST(id AS VARCHAR) AS key", "upper(user) AS user", "amount * 2 AS double"),
     "SELECT CAST(id AS VARCHAR) AS key, upper(user) AS user, amount * 2 AS double FROM batch"),
    ("where", lambda s: s.where("user IS NOT NULL AND amount > 0"),
     "SELECT * FROM batch WHERE user IS NOT NULL AND amount > 0"),
    ("filter_sql", lambda s: s.filter("amount < 0"), "SELECT * FROM batch WHERE amount < 0"),
    ("filter_callable", lambda s: s.filter(lambda t: pc.greater(t.column("id"), 120)),
     "SELECT * FROM batch WHERE id > 120"),
    ("with_column_new",
     lambda s: s.with_column("parsed", "CAST(json_extract_string(body, '$.amount') AS DOUBLE)"),
     "SELECT *, CAST(json_extract_string(body, '$.amount') AS DOUBLE) AS parsed FROM batch"),
    ("with_column_replace", lambda s: s.with_column("amount", "amount + 1"),
     "SELECT id, user, amount + 1 AS amount, body FROM batch"),
    ("with_column_renamed", lambda s: s.with_column_renamed("user", "who"),
     "SELECT id, user AS who, amount, body FROM batch"),
    ("drop", lambda s: s.drop("body", "not_a_column"), "SELECT id, user, amount FROM batch"),
    ("select_names", lambda s: s.select("amount", "id"), "SELECT amount, id FROM batch"),
    ("select_star", lambda s: s.select("*"), "SELECT * FROM batch"),
    ("sql", lambda s: s.sql("SELECT user, sum(amount) AS total FROM batch GROUP BY user"), ""),
    ("chain",
     lambda s: s.select_expr("id", "user", "amount").where("amount > 0").with_column("big", "amount > 5")
     .with_column_renamed("big", "is_big").where("is_big OR user = 'u1'"),
     "SELECT id, user, amount, amount > 5 AS is_big FROM batch WHERE amount > 0 AND (amount > 5 OR user = 'u1')"),
    ("map_then_sql", lambda s: s.map_batches(lambda t: t.slice(0, 10)).where("id % 2 = 0"), ""),
]  # fmt: skip


@pytest.mark.parametrize(("case", "build", "query"), STREAM_STEPS, ids=[c[0] for c in STREAM_STEPS])
def test_each_stateless_step_matches_duckdb(case: str, build: Callable[[hr.StreamFrame], hr.StreamFrame], query: str,
                                            tmp_path: Path) -> None:  # fmt: skip
    name, everything = make_input()
    got = run(build(hr.read_stream.format("memory").option("name", name).load()), tmp_path)
    if case == "sql":  # a per-batch GROUP BY: compare batch by batch
        per_batch = [duck(t, "SELECT user, sum(amount) AS total FROM batch GROUP BY user")
                     for t in memory_stream(name).slice(0, 4)]  # fmt: skip
        expected = pa.concat_tables(per_batch)
    elif case == "map_then_sql":
        expected = pa.concat_tables([duck(t.slice(0, 10), "SELECT * FROM batch WHERE id % 2 = 0")
                                     for t in memory_stream(name).slice(0, 4)])  # fmt: skip
    else:
        expected = duck(everything, query)
    assert got.column_names == expected.column_names
    assert got.schema.types == expected.schema.types
    assert rows(got) == rows(expected)
    assert got.num_rows > 0


def test_a_batch_without_rows_still_gives_the_sink_the_output_schema(tmp_path: Path) -> None:
    name, _ = make_input(batches=1)
    seen: list[pa.Table] = []
    frame = hr.read_stream.format("memory").option("name", name).load().where("id < 0").select_expr("id + 1 AS n")
    q = frame.write_stream.foreach_batch(lambda t, _b: seen.append(t)).trigger(available_now=True).start()
    assert q.await_termination(30)
    assert len(seen) == 1 and seen[0].num_rows == 0
    assert seen[0].schema == pa.schema([("n", pa.int64())])


def test_consecutive_sql_steps_run_as_one_duckdb_query() -> None:
    from headrace.engine.plan import PlanRunner

    s = hr.read_stream.format("memory").option("name", "x").load()
    frame = s.select_expr("id", "amount").where("amount > 0").with_column("a2", "amount * 2").drop("id").sql(
        "SELECT a2 FROM batch")  # fmt: skip
    runner = PlanRunner(frame._steps, SCHEMA)
    assert len(runner.prefix) == 3  # fused SQL, drop (Arrow), SQL
    assert runner.output_schema == pa.schema([("a2", pa.float64())])
    assert not runner.suffix


# ------------------------------------------------------------------ errors
def test_bad_sql_is_refused_at_definition_naming_the_expression() -> None:
    s = hr.read_stream.format("memory").option("name", "x").load()
    with pytest.raises(ExpressionError, match=r"where\('amount >> > 0'\) is not valid SQL"):
        s.where("amount >> > 0")
    with pytest.raises(ExpressionError, match=r"select_expr\('CAST\(id AS\)'\)"):
        s.select_expr("CAST(id AS)")
    with pytest.raises(ExpressionError, match="must be a SELECT"):
        s.sql("DELETE FROM batch")
    with pytest.raises(ExpressionError, match="exactly one"):
        s.sql("SELECT 1 FROM batch; SELECT 2 FROM batch")


def test_an_unknown_column_is_refused_at_definition_when_the_schema_is_known() -> None:
    s = hr.read_stream.format("memory").option("name", "x").schema(SCHEMA).load()
    with pytest.raises(ExpressionError, match=r"with_column\('x', 'nope \+ 1'\) failed.*nope"):
        s.with_column("x", "nope + 1")
    with pytest.raises(ExpressionError, match=r"select\('nope'\): no column 'nope'"):
        s.select("nope")


def test_an_unknown_column_is_refused_at_start_before_any_data_is_read(tmp_path: Path) -> None:
    name, _ = make_input(batches=1)
    reads: list[int] = []
    frame = (hr.read_stream.format("memory").option("name", name).load()
             .map_batches(lambda t: cast(Any, reads.append(t.num_rows)) or t, schema=SCHEMA)
             .select_expr("id", "amount_typo * 2 AS a"))  # fmt: skip
    with pytest.raises(ExpressionError, match=r"select_expr\('id', 'amount_typo \* 2 AS a'\) failed.*amount_typo"):
        frame.write_stream.format("memory").query_name("never").option("checkpointLocation", str(tmp_path)).start()
    assert reads == []
    assert not (tmp_path / "commits").exists() or not any((tmp_path / "commits").iterdir())


def test_a_bad_watermark_column_is_refused_at_start(tmp_path: Path) -> None:
    name, _ = make_input(batches=1)
    frame = hr.read_stream.format("memory").option("name", name).load().with_watermark("user", "1 minute")
    with pytest.raises(ExpressionError, match="column 'user' is string, not a timestamp"):
        frame.write_stream.format("memory").query_name("wm").option("checkpointLocation", str(tmp_path)).start()


def test_filter_rejects_what_is_neither_sql_nor_a_function() -> None:
    s = hr.read_stream.format("memory").option("name", "x").load()
    with pytest.raises(HeadraceError, match="SQL condition"):
        s.filter(42)  # type: ignore[arg-type]


def test_a_bad_state_store_option_is_refused(tmp_path: Path) -> None:
    s = hr.read_stream.format("memory").option("name", "x").load()
    with pytest.raises(hr.OptionsError, match="stateStore"):
        s.write_stream.format("memory").query_name("ss").option("stateStore", "redis").start()


def test_complete_mode_without_an_aggregation_is_refused_with_sparks_reason(tmp_path: Path) -> None:
    name, _ = make_input(batches=1)
    frame = hr.read_stream.format("memory").option("name", name).load().where("id > 1")
    with pytest.raises(hr.UnsupportedError, match="Complete output mode not supported when there are no streaming aggregations"):
        frame.write_stream.format("memory").query_name("cm").output_mode("complete").start()


def test_drop_duplicates_within_watermark_needs_a_watermark() -> None:
    with pytest.raises(HeadraceError, match="needs an event-time watermark"):
        hr.read_stream.format("memory").option("name", "x").load().drop_duplicates_within_watermark("user")


def test_cast_of_binary_to_string_decodes_utf8_as_spark_does(tmp_path: Path) -> None:
    # Kafka's key/value are bytes: Spark's CAST(value AS STRING) decodes UTF-8, DuckDB's CAST escapes
    # non-ASCII bytes; headrace gives Spark's result (NULL for bytes that are not UTF-8)
    name = f"bin-{uuid.uuid4().hex[:6]}"
    values = ["héllo wörld", '{"amount": 3, "who": "Zoë"}', "plain"]
    memory_stream(name, pa.schema([("key", pa.binary()), ("value", pa.binary())])).add(
        pa.table({"key": [b"k1", b"\xff\xfe", None], "value": [v.encode() for v in values]}))  # fmt: skip
    frame = hr.read_stream.format("memory").option("name", name).load().with_column("body2", "value::STRING").select_expr(
        "CAST(key AS STRING) AS user", "CAST(value AS VARCHAR) AS body", "body2")  # fmt: skip
    got = run(frame, tmp_path)
    assert got.column("user").to_pylist() == ["k1", None, None]
    assert got.column("body").to_pylist() == values
    assert got.column("body2").to_pylist() == values


def test_a_map_batches_function_is_never_probed_and_a_declared_schema_is_used() -> None:
    from headrace.engine.plan import PlanRunner

    calls: list[int] = []
    s = hr.read_stream.format("memory").option("name", "x").load()
    undeclared = s.map_batches(lambda t: cast(Any, calls.append(1)) or t.select(["id"])).where("id > 0")
    runner = PlanRunner(undeclared._steps, SCHEMA)
    assert runner.output_schema is None and runner.sink_schema is None and calls == []
    declared = s.map_batches(lambda t: t.select(["id"]), schema=pa.schema([("id", pa.int64())])).where("id > 0")
    assert PlanRunner(declared._steps, SCHEMA).sink_schema == pa.schema([("id", pa.int64())])
    assert PlanRunner(s.filter(lambda t: pc.greater(t.column("id"), 1))._steps, SCHEMA).sink_schema == SCHEMA
