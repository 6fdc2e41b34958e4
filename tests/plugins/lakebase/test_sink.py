"""The lakebase sink against a real PostgreSQL: upserts, inserts, keys, types, errors."""

from __future__ import annotations

import datetime as dt
import decimal
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

import headrace as hr
from headrace.protocols import SinkContext
from headrace_lakebase.sink import LakebaseSink
from headrace_lakebase.table import SchemaMismatchError, UpsertKeyError
from tests.plugins.lakebase.helpers import batches, keyed_mod_100, keyed_mod_3000, run_query

Query = Callable[..., list[tuple[Any, ...]]]


def make_sink(options: dict[str, Any], query_id: str = "q") -> LakebaseSink:
    spec = hr.registry().get("lakebase")
    opts = spec.sink_options.parse(options, connector="lakebase", role="sink")
    return LakebaseSink(opts, SinkContext(query_id=query_id, run_id=uuid.uuid4().hex))


def write(sink: LakebaseSink, batch_id: int, table: pa.Table, chunk: int = 1000) -> None:
    sink.commit(batch_id, [sink.write(batch_id, batches(table, chunk))])


def test_upsert_with_given_key_creates_table_and_updates(pg_options: dict[str, Any], table: str, query: Query) -> None:
    sink = make_sink({**pg_options, "upsertkey": "id", "batchsize": 3})
    write(sink, 0, pa.table({"id": [1, 2, 3, 4], "v": ["a", "b", "c", "d"]}))
    write(sink, 1, pa.table({"id": [3, 4, 5], "v": ["C", "D", "E"]}))
    sink.close()
    assert query(f"SELECT id, v FROM {table} ORDER BY id") == [(1, "a"), (2, "b"), (3, "C"), (4, "D"), (5, "E")]
    pk = query("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
               "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary", (table,))  # fmt: skip
    assert pk == [("id",)]


def test_key_inferred_from_primary_key(pg_options: dict[str, Any], table: str, query: Query) -> None:
    query(f'CREATE TABLE {table} (a int, "B" text, v text, PRIMARY KEY (a, "B"))')
    sink = make_sink(pg_options)
    write(sink, 0, pa.table({"a": pa.array([1, 1, 2], pa.int32()), "B": ["x", "y", "x"], "v": ["1", "2", "3"]}))
    write(sink, 1, pa.table({"a": pa.array([1], pa.int32()), "B": ["y"], "v": ["updated"]}))
    sink.close()
    assert query(f'SELECT a, "B", v FROM {table} ORDER BY a, "B"') == [(1, "x", "1"), (1, "y", "updated"), (2, "x", "3")]


def test_insert_mode_without_key(pg_options: dict[str, Any], table: str, query: Query) -> None:
    sink = make_sink({**pg_options, "batchsize": 2})
    write(sink, 0, pa.table({"id": [1, 1, 2], "v": ["a", "a", "b"]}))
    write(sink, 1, pa.table({"id": [1], "v": ["a"]}))
    sink.close()
    assert query(f"SELECT id, v FROM {table} ORDER BY id") == [(1, "a"), (1, "a"), (1, "a"), (2, "b")]


@pytest.mark.parametrize("given", ["other", "id,other", "v"], ids=["wrong-column", "superset", "non-key"])
def test_upsertkey_not_the_primary_key_fails_before_writing(
    pg_options: dict[str, Any], table: str, query: Query, given: str
) -> None:
    query(f"CREATE TABLE {table} (id bigint PRIMARY KEY, other bigint, v text)")
    sink = make_sink({**pg_options, "upsertkey": given})
    with pytest.raises(UpsertKeyError, match=r"is not the primary key of public\.t_\w+: its primary key is \(id\)"):
        write(sink, 0, pa.table({"id": [1], "other": [2], "v": ["x"]}))
    sink.close()
    assert query(f"SELECT count(*) FROM {table}") == [(0,)]


def test_upsertkey_on_table_without_primary_key_fails(pg_options: dict[str, Any], table: str, query: Query) -> None:
    query(f"CREATE TABLE {table} (id bigint, v text)")
    sink = make_sink({**pg_options, "upsertkey": "id"})
    with pytest.raises(UpsertKeyError, match="it has no primary key"):
        write(sink, 0, pa.table({"id": [1], "v": ["x"]}))
    sink.close()


def test_upsertkey_missing_from_data_or_not_comparable(pg_options: dict[str, Any]) -> None:
    sink = make_sink({**pg_options, "upsertkey": "nope"})
    with pytest.raises(UpsertKeyError, match="nope"):
        write(sink, 0, pa.table({"id": [1]}))
    sink.close()
    sink = make_sink({**pg_options, "upsertkey": "s"})
    with pytest.raises(UpsertKeyError, match="cannot be keys"):
        write(sink, 0, pa.table({"s": [{"a": 1}]}))
    sink.close()


def test_duplicate_keys_in_one_chunk_keep_the_last(pg_options: dict[str, Any], table: str, query: Query) -> None:
    sink = make_sink({**pg_options, "upsertkey": "k", "batchsize": 10_000})
    data = keyed_mod_100(pa.table({"timestamp": pa.array(range(5000), pa.int64()), "value": pa.array(range(5000))}))
    write(sink, 0, data, chunk=700)
    sink.close()
    rows = query(f"SELECT k, value FROM {table} ORDER BY k")
    assert rows == [(k, 4900 + k) for k in range(100)]
    assert query(f"SELECT count(*) FROM _headrace_lakebase_commits WHERE target = 'public.{table}' AND chunk >= 0") == [(1,)]


def test_chunks_of_batchsize_rows_one_transaction_each(pg_options: dict[str, Any], table: str, query: Query) -> None:
    sink = make_sink({**pg_options, "batchsize": 300, "batchinterval": "1 hour"})
    write(sink, 0, pa.table({"v": list(range(1000))}), chunk=128)
    sink.close()
    chunks = query("SELECT chunk, row_start, row_end FROM _headrace_lakebase_commits WHERE target = %s AND chunk >= 0 ORDER BY chunk",
                   (f"public.{table}",))  # fmt: skip
    assert chunks == [(0, 0, 300), (1, 300, 600), (2, 600, 900), (3, 900, 1000)]
    assert query(f"SELECT count(*), count(DISTINCT v) FROM {table}") == [(1000, 1000)]


def test_replayed_batch_is_skipped_and_commit_forgets_old_batches(
    pg_options: dict[str, Any], table: str, query: Query
) -> None:
    data = pa.table({"v": list(range(50))})
    first = make_sink({**pg_options, "batchsize": 20}, query_id="replay")
    msg0 = first.write(0, batches(data, 7))
    first.close()
    again = make_sink({**pg_options, "batchsize": 20}, query_id="replay")
    msg1 = again.write(0, batches(data, 13))  # replay with other record-batch boundaries
    assert (msg0.rows, msg0.skipped, msg1.rows, msg1.skipped, msg1.chunks) == (50, 0, 50, 50, 0)
    again.commit(0, [msg1])
    write(again, 1, pa.table({"v": [100]}))
    again.close()
    assert query(f"SELECT count(*) FROM {table}") == [(51,)]
    left = query("SELECT DISTINCT batch_id FROM _headrace_lakebase_commits WHERE target = %s", (f"public.{table}",))
    assert left == [(1,)]


def test_types_are_mapped_and_round_trip(pg_options: dict[str, Any], table: str, query: Query) -> None:
    ts = dt.datetime(2024, 5, 1, 12, 30, 0, 123456)
    data = pa.table({
        "b": pa.array([True, None]),
        "i8": pa.array([1, None], pa.int8()),
        "i16": pa.array([2, 3], pa.int16()),
        "i32": pa.array([3, None], pa.int32()),
        "i64": pa.array([2**40, -1], pa.int64()),
        "u64": pa.array([2**63 + 1, 0], pa.uint64()),
        "f32": pa.array([1.5, None], pa.float32()),
        "f64": pa.array([2.25, float("inf")], pa.float64()),
        "dec": pa.array([decimal.Decimal("12.345"), None], pa.decimal128(10, 3)),
        "s": pa.array(["héllo", None]),
        "ls": pa.array(["x", "y"], pa.large_string()),
        "bin": pa.array([b"\x00\xff", None]),
        "d": pa.array([dt.date(2024, 5, 1), dt.date(1960, 1, 1)]),
        "ts": pa.array([ts, None], pa.timestamp("us")),
        "tstz": pa.array([ts, ts], pa.timestamp("ms", tz="UTC")),
        "tm": pa.array([dt.time(1, 2, 3), None], pa.time64("us")),
        "ints": pa.array([[1, 2], None], pa.list_(pa.int64())),
        "strs": pa.array([["a", None], []], pa.list_(pa.string())),
        "st": pa.array([{"x": 1, "y": "z"}, None], pa.struct([("x", pa.int64()), ("y", pa.string())])),
        "m": pa.array([[("k", 1)], None], pa.map_(pa.string(), pa.int64())),
        "nested": pa.array([[[1], [2, 3]], None], pa.list_(pa.list_(pa.int64()))),
    })  # fmt: skip
    sink = make_sink(pg_options)
    write(sink, 0, data)
    sink.close()
    types: dict[str, str] = dict(
        query("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s", (table,)))
    assert types == {
        "b": "boolean", "i8": "smallint", "i16": "smallint", "i32": "integer", "i64": "bigint", "u64": "numeric",
        "f32": "real", "f64": "double precision", "dec": "numeric", "s": "text", "ls": "text", "bin": "bytea",
        "d": "date", "ts": "timestamp without time zone", "tstz": "timestamp with time zone",
        "tm": "time without time zone", "ints": "ARRAY", "strs": "ARRAY", "st": "jsonb", "m": "jsonb",
        "nested": "jsonb",
    }  # fmt: skip
    cols = list(data.column_names)
    got = query(f"SELECT {', '.join(cols)} FROM {table} ORDER BY i16")
    assert got[0] == (
        True, 1, 2, 3, 2**40, 2**63 + 1, 1.5, 2.25, decimal.Decimal("12.345"), "héllo", "x", b"\x00\xff",
        dt.date(2024, 5, 1), ts, ts.replace(microsecond=123000, tzinfo=dt.UTC), dt.time(1, 2, 3), [1, 2],
        ["a", None], {"x": 1, "y": "z"}, {"k": 1}, [[1], [2, 3]],
    )  # fmt: skip
    assert got[1] == (
        None, None, 3, None, -1, 0, None, float("inf"), None, None, "y", None, dt.date(1960, 1, 1), None,
        ts.replace(microsecond=123000, tzinfo=dt.UTC), None, None, [], None, None, None,
    )  # fmt: skip


def test_existing_table_with_wider_types_accepts_narrower_data(pg_options: dict[str, Any], table: str, query: Query) -> None:
    query(f"CREATE TABLE {table} (id bigint PRIMARY KEY, v varchar(10), n numeric, j json, extra text DEFAULT 'd')")
    sink = make_sink(pg_options)
    write(sink, 0, pa.table({"id": pa.array([1], pa.int16()), "v": ["x"], "n": pa.array([7], pa.int32()),
                             "j": ['{"a": [1]}']}))  # fmt: skip
    sink.close()
    assert query(f"SELECT id, v, n, j, extra FROM {table}") == [(1, "x", decimal.Decimal(7), {"a": [1]}, "d")]


def test_data_that_does_not_fit_names_columns_and_types(pg_options: dict[str, Any], table: str, query: Query) -> None:
    query(f"CREATE TABLE {table} (id bigint PRIMARY KEY, v integer, must text NOT NULL)")
    sink = make_sink(pg_options)
    with pytest.raises(SchemaMismatchError) as e:
        write(sink, 0, pa.table({"id": [1], "v": ["not a number"], "surprise": [1.5]}))
    sink.close()
    msg = str(e.value)
    assert "surprise (double)" in msg
    assert "v (data string, table integer)" in msg
    assert "NOT NULL columns without default missing from the data: must" in msg
    assert query(f"SELECT count(*) FROM {table}") == [(0,)]


def test_columns_with_odd_names_are_quoted(pg_options: dict[str, Any], table: str, query: Query) -> None:
    names = ['we"ird', "semi;colon", "Upper Case", "select"]
    sink = make_sink({**pg_options, "upsertkey": "select"})
    write(sink, 0, pa.table({n: [1, 2] for n in names}))
    write(sink, 1, pa.table({n: [2, 3] for n in names}))
    sink.close()
    assert query(f'SELECT "select" FROM {table} ORDER BY 1') == [(1,), (2,), (3,)]


def test_empty_and_all_empty_batches(pg_options: dict[str, Any], table: str, query: Query) -> None:
    sink = make_sink(pg_options)
    sink.commit(0, [sink.write(0, iter([]))])
    empty = pa.table({"v": pa.array([], pa.int64())})
    sink.commit(1, [sink.write(1, iter(empty.to_batches()))])
    sink.close()
    assert query("SELECT to_regclass(%s)", (f"public.{table}",)) == [(None,)]


def test_two_concurrent_queries_on_overlapping_keys_do_not_deadlock(
    pg_options: dict[str, Any], table: str, query: Query, tmp_path: Path
) -> None:
    query(f"CREATE TABLE {table} (k bigint PRIMARY KEY, value bigint)")
    opts = {**pg_options, "batchsize": 3000}
    errors: list[BaseException] = []

    def run(name: str, reverse: bool) -> None:
        def transform(t: pa.Table) -> pa.Table:
            out = keyed_mod_3000(t)
            return out.take(pa.array(range(out.num_rows - 1, -1, -1))) if reverse else out

        try:
            q = run_query(opts, checkpoint=str(tmp_path / name), rows=24_000, per_batch=6000, transform=transform)
            if q.exception() is not None:
                raise q.exception()  # type: ignore[misc]
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(f"q{i}", i == 1)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert query(f"SELECT count(*) FROM {table}") == [(3000,)]
    deadlocks = query("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
    assert deadlocks == [(0,)]


def test_endpoint_without_plugin_says_what_to_install(table: str) -> None:
    sink = make_sink({"endpoint": "proj.branch", "dbtable": table})
    with pytest.raises(hr.HeadraceError, match="no installed plugin implements the headrace_lakebase_resolve_endpoint"):
        write(sink, 0, pa.table({"v": [1]}))
    sink.close()


def test_endpoint_resolved_by_a_plugin(postgres: Any, table: str, query: Query) -> None:
    from headrace.plugins import hookimpl
    from headrace_lakebase import ConnectionParams

    calls: list[tuple[str, dict[str, Any]]] = []
    tokens: list[int] = []

    class FakeDatabricksAuth:
        @hookimpl
        def headrace_lakebase_resolve_endpoint(self, endpoint: str, options: dict[str, Any]) -> ConnectionParams | None:
            calls.append((endpoint, options))
            if endpoint != "myproject.main.ep1":
                return None

            def token() -> str:
                tokens.append(1)
                return postgres.password

            return ConnectionParams(host=postgres.host, port=postgres.port, user=postgres.user,
                                    database=postgres.dbname, password_provider=token)  # fmt: skip

    plugin = FakeDatabricksAuth()
    hr.registry().register_module(plugin, "fake-databricks-auth")
    try:
        sink = make_sink({"endpoint": "myproject.main.ep1", "dbtable": table, "upsertkey": "v"})
        write(sink, 0, pa.table({"v": [1, 2]}))
        sink.close()
    finally:
        hr.registry().pm.unregister(plugin)
    assert query(f"SELECT count(*) FROM {table}") == [(2,)]
    assert calls and calls[0][0] == "myproject.main.ep1" and calls[0][1]["dbtable"] is not None
    assert tokens, "the password provider was not used"


def test_wrong_password_fails_without_showing_it(postgres: Any, table: str) -> None:
    sink = make_sink({"host": postgres.host, "port": postgres.port, "user": postgres.user,
                      "password": "wrong-pass-123", "database": postgres.dbname, "dbtable": table})  # fmt: skip
    with pytest.raises(psycopg.OperationalError) as e:
        write(sink, 0, pa.table({"v": [1]}))
    sink.close()
    assert "wrong-pass-123" not in str(e.value)


def test_writers_creating_the_same_table_at_once_do_not_collide(postgres: Any, table: str) -> None:
    """Spark tasks of one batch each find the table missing; exactly one creates it."""
    from headrace_lakebase._options import parse_dbtable
    from headrace_lakebase.table import plan_table

    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def create() -> None:
        try:
            with psycopg.connect(postgres.dsn) as conn:
                barrier.wait()
                plan_table(conn, parse_dbtable(table), schema, ["id"])
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=create) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors


def test_a_view_named_by_dbtable_is_refused(postgres: Any, table: str) -> None:
    from headrace_lakebase._options import parse_dbtable
    from headrace_lakebase.table import plan_table

    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE VIEW {table} AS SELECT 1 AS id")
        with pytest.raises(SchemaMismatchError, match="exists but is not a table"):
            plan_table(conn, parse_dbtable(table), pa.schema([("id", pa.int64())]), None)


@pytest.mark.parametrize("name", ["c" * 64, ""], ids=["64-bytes", "empty"])
def test_column_names_postgres_cannot_hold_fail_before_the_table_is_created(
    pg_options: dict[str, Any], table: str, query: Query, name: str
) -> None:
    sink = make_sink(pg_options)
    with pytest.raises(SchemaMismatchError, match="column name"):
        write(sink, 0, pa.table({"id": [1], name: [2]}))
    sink.close()
    assert query("SELECT to_regclass(%s)", (f"public.{table}",)) == [(None,)]
