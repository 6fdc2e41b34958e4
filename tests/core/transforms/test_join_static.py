"""Static frames (a connector read once) and stream-static joins: results against DuckDB over
all the input, the snapshot taken when the stream starts (later changes not seen until a
restart), and errors before any data is read."""

from __future__ import annotations

import uuid
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

import headrace as hr
from headrace.errors import HeadraceError
from headrace.testing import memory_stream
from headrace.transforms.expressions import ExpressionError

FACTS = pa.schema([("customer_id", pa.int64()), ("value", pa.int64()), ("region", pa.string())])
DIMS = pa.schema([("customer_id", pa.int64()), ("name", pa.string()), ("region_code", pa.string())])


def facts(chunk_rows: int, chunks: int = 3) -> tuple[str, pa.Table]:
    name = f"facts-{uuid.uuid4().hex[:6]}"
    stream = memory_stream(name, FACTS)
    tables = []
    for c in range(chunks):
        ids = [(c * chunk_rows + i) % 13 if i % 11 else None for i in range(chunk_rows)]
        t = pa.table({"customer_id": ids, "value": [c * chunk_rows + i for i in range(chunk_rows)],
                      "region": [f"r{i % 3}" for i in range(chunk_rows)]}, schema=FACTS)  # fmt: skip
        stream.add(t)
        tables.append(t)
    return name, pa.concat_tables(tables)


def dims() -> pa.Table:
    ids = [1, 2, 3, 3, 5, 8, 13, 21, None]  # 3 twice: two output rows per match, as in SQL
    return pa.table({"customer_id": ids, "name": [f"c{i}" for i in range(len(ids))],
                     "region_code": [f"r{i % 3}" for i in range(len(ids))]}, schema=DIMS)  # fmt: skip


def run(frame: hr.StreamFrame, tmp_path: Path) -> pa.Table:
    out = f"out-{uuid.uuid4().hex[:8]}"
    q = (frame.write_stream.format("memory").query_name(out).option("checkpointLocation", str(tmp_path / out))
         .trigger(available_now=True).start())  # fmt: skip
    assert q.await_termination(60)
    return hr.memory_table(out)


def duck(query: str, **tables: pa.Table) -> pa.Table:
    con = duckdb.connect()
    for k, v in tables.items():
        con.register(k, v)
    return con.sql(query).to_arrow_table()


def rows(t: pa.Table) -> list[tuple[object, ...]]:
    return sorted((tuple(r.values()) for r in t.to_pylist()), key=repr)


@pytest.mark.parametrize("chunk_rows", [50, 5000], ids=["small-chunks-index", "large-chunks-duckdb"])
@pytest.mark.parametrize("how", ["inner", "left"])
def test_join_on_keys_matches_duckdb(how: str, chunk_rows: int, tmp_path: Path) -> None:
    name, everything = facts(chunk_rows)
    stream = hr.read_stream.format("memory").option("name", name).load()
    got = run(stream.join(dims(), on="customer_id", how=how), tmp_path)
    join = "JOIN" if how == "inner" else "LEFT JOIN"
    want = duck(f"SELECT b.customer_id, b.value, b.region, s.name, s.region_code FROM batch b {join} static s "
                "ON b.customer_id = s.customer_id", batch=everything, static=dims())  # fmt: skip
    assert got.column_names == ["customer_id", "value", "region", "name", "region_code"]
    assert got.schema.types == want.schema.types
    assert rows(got) == rows(want)


@pytest.mark.parametrize("chunk_rows", [50, 5000], ids=["small-chunks-index", "large-chunks-duckdb"])
@pytest.mark.parametrize("how", ["left_semi", "semi", "leftanti", "anti"])
def test_semi_and_anti_joins_keep_the_stream_rows_with_and_without_a_match(how: str, chunk_rows: int,
                                                                           tmp_path: Path) -> None:  # fmt: skip
    name, everything = facts(chunk_rows)
    stream = hr.read_stream.format("memory").option("name", name).load().select("value", "customer_id", "region")
    got = run(stream.join(dims(), on="customer_id", how=how), tmp_path)
    exists = "EXISTS" if "semi" in how else "NOT EXISTS"  # NULL keys match nothing: kept by anti, dropped by semi
    want = duck(f"SELECT customer_id, value, region FROM batch b WHERE {exists} (SELECT 1 FROM static s "
                "WHERE b.customer_id = s.customer_id)", batch=everything, static=dims())  # fmt: skip
    assert got.column_names == ["customer_id", "value", "region"]  # the keys first, the stream's columns only
    assert got.schema.types == want.schema.types
    assert rows(got) == rows(want)
    assert want.num_rows and want.num_rows < everything.num_rows


def test_semi_and_anti_joins_on_a_sql_condition_match_duckdb(tmp_path: Path) -> None:
    name, everything = facts(40)
    stream = hr.read_stream.format("memory").option("name", name).load()
    lookup = dims().rename_columns(["lookup_key", "name", "region_code"])
    for how, exists in (("left_semi", "EXISTS"), ("left_anti", "NOT EXISTS")):
        got = run(stream.join(lookup, on="customer_id = lookup_key AND region = region_code", how=how), tmp_path)
        want = duck(f"SELECT * FROM batch WHERE {exists} (SELECT 1 FROM static WHERE customer_id = lookup_key "
                    "AND region = region_code)", batch=everything, static=lookup)  # fmt: skip
        assert got.column_names == FACTS.names
        assert rows(got) == rows(want) and want.num_rows


@pytest.mark.parametrize(("how", "want"), [
    ("inner", [(1, "a", "x")]),
    ("left", [(1, "a", "x"), (2, "b", None), (None, "n", None)]),
    ("right_outer", [(1, "a", "x"), (3, None, "z")]),
    ("full", [(1, "a", "x"), (2, "b", None), (3, None, "z"), (None, "n", None)]),
    ("semi", [(1, "a")]),
    ("left_anti", [(2, "b"), (None, "n")]),
], ids=["inner", "left", "right", "full", "semi", "anti"])  # fmt: skip
def test_two_static_frames_join_with_every_join_type(how: str, want: list[tuple[object, ...]]) -> None:
    left = hr.StaticFrame.from_arrow(pa.table({"v": ["a", "b", "n"], "k": pa.array([1, 2, None], pa.int64())}))
    right = pa.table({"k": pa.array([1, 3], pa.int64()), "w": ["x", "z"]})
    got = left.join(right, on="k", how=how).to_arrow()
    assert got.column_names == (["k", "v"] if "semi" in how or "anti" in how else ["k", "v", "w"])
    assert rows(got) == sorted(want, key=repr)


def test_one_table_of_join_types_in_spark_spellings() -> None:
    from headrace.transforms.join import STREAM_STATIC_JOIN_TYPES, join_type

    spelled = {how: join_type(how) for how in ("INNER", "cross", "left_outer", "LeftOuter", "right", "outer",
                                               "full_outer", "semi", "left_semi", "anti", "leftanti")}  # fmt: skip
    assert spelled == {"INNER": "inner", "cross": "inner", "left_outer": "left", "LeftOuter": "left",
                       "right": "right", "outer": "full", "full_outer": "full", "semi": "left_semi",
                       "left_semi": "left_semi", "anti": "left_anti", "leftanti": "left_anti"}  # fmt: skip
    assert STREAM_STATIC_JOIN_TYPES == ("inner", "left", "left_semi", "left_anti")


def test_join_on_several_keys_and_on_a_sql_condition_match_duckdb(tmp_path: Path) -> None:
    name, everything = facts(40)
    stream = hr.read_stream.format("memory").option("name", name).load()
    d = dims().rename_columns(["customer_id", "name", "region"])
    got = run(stream.join(d, on=["customer_id", "region"]), tmp_path)
    want = duck("SELECT b.customer_id, b.region, b.value, s.name FROM batch b JOIN static s "
                "USING (customer_id, region)", batch=everything, static=d)  # fmt: skip
    assert got.column_names == ["customer_id", "region", "value", "name"]
    assert rows(got) == rows(want)
    lookup = dims().rename_columns(["lookup_key", "name", "region_code"])
    got = run(stream.join(lookup, on="customer_id = lookup_key AND value % 2 = 0", how="left"), tmp_path)
    want = duck("SELECT * FROM batch LEFT JOIN static ON customer_id = lookup_key AND value % 2 = 0",
                batch=everything, static=lookup)  # fmt: skip
    assert rows(got) == rows(want)


def test_the_static_side_is_a_snapshot_taken_when_the_stream_starts(tmp_path: Path) -> None:
    # seeds/004: a customer added after the stream started is not joined until a restart
    dims_name, facts_name = f"dims-{uuid.uuid4().hex[:6]}", f"tx-{uuid.uuid4().hex[:6]}"
    customers = memory_stream(dims_name, pa.schema([("customer_id", pa.int64()), ("name", pa.string())]))
    customers.add([{"customer_id": 1, "name": "Bilal"}, {"customer_id": 2, "name": "Olga"}])
    tx = memory_stream(facts_name, pa.schema([("customer_id", pa.int64()), ("value", pa.int64())]))
    static = hr.read.format("memory").option("name", dims_name).load()
    report = (hr.read_stream.format("memory").option("name", facts_name).load()
              .join(static, on="customer_id", how="inner"))  # fmt: skip
    out = f"sales-{uuid.uuid4().hex[:6]}"

    def start() -> hr.StreamingQuery:
        return (report.write_stream.format("memory").query_name(out).option("checkpointLocation", str(tmp_path))
                .trigger(processing_time="10 milliseconds").start())  # fmt: skip

    q = start()
    try:
        tx.add([{"customer_id": 1, "value": 100}, {"customer_id": 2, "value": 150}])
        q.process_all_available(30)
        customers.add([{"customer_id": 3, "name": "Zoya"}])  # the dimension changes...
        tx.add([{"customer_id": 3, "value": 299}])
        q.process_all_available(30)
    finally:
        q.stop()
    assert rows(hr.memory_table(out)) == [(1, 100, "Bilal"), (2, 150, "Olga")]  # ...not seen by this run
    q = start()
    try:
        tx.add([{"customer_id": 3, "value": 300}])
        q.process_all_available(30)
    finally:
        q.stop()
    assert rows(hr.memory_table(out)) == [(1, 100, "Bilal"), (2, 150, "Olga"), (3, 300, "Zoya")]


def test_a_static_read_takes_everything_available_now_and_applies_its_steps() -> None:
    frame = (hr.read.format("rate-micro-batch").option("rowsPerBatch", 100).option("totalRows", 1000)
             .option("numPartitions", 3).load().where("value % 10 = 0").select_expr("value", "value * 2 AS twice"))  # fmt: skip
    t = frame.to_arrow()
    assert t.column("value").to_pylist() == list(range(0, 1000, 10))
    assert t.column("twice").to_pylist() == [2 * v for v in range(0, 1000, 10)]
    assert frame.schema == t.schema


def test_a_static_frame_over_an_arrow_table_is_checked_at_definition() -> None:
    frame = hr.StaticFrame.from_arrow(dims())
    with pytest.raises(ExpressionError, match=r"where\('nope > 1'\) failed.*nope"):
        frame.where("nope > 1")
    assert frame.with_column("x", "customer_id * 10").drop("name").to_arrow().column("x").to_pylist() == [
        10, 20, 30, 30, 50, 80, 130, 210, None]  # fmt: skip


@pytest.mark.parametrize(("on", "how", "error"), [
    ("customer_id", "right", "a stream-static join is 'inner', 'left', 'left_semi' or 'left_anti'"),
    ("customer_id", "full_outer", "right and full joins would need state over the whole stream"),
    ("customer_id", "sideways", r"join\(how='sideways'\) is no join type"),
    ("nope", "inner", r"join\(on=\['nope'\], how='inner'\): the stream has no \['nope'\]"),
    ("region_code", "inner", r"the stream has no \['region_code'\]"),
    ("customer_id = = 1", "inner", "is not valid SQL"),
], ids=["right-join", "full-join", "unknown-how", "unknown-key", "key-only-on-static", "bad-condition"])  # fmt: skip
def test_join_errors_before_any_data_is_read(on: str, how: str, error: str, tmp_path: Path) -> None:
    stream = hr.read_stream.format("memory").option("name", "nothing-yet").schema(FACTS).load()
    with pytest.raises(HeadraceError, match=error):
        frame = stream.join(dims(), on=on, how=how)
        frame.write_stream.format("memory").query_name("never").option("checkpointLocation", str(tmp_path)).start()


def test_columns_on_both_sides_are_refused_naming_them() -> None:
    stream = hr.read_stream.format("memory").option("name", "x").schema(FACTS).load()
    clash = dims().rename_columns(["customer_id", "value", "region_code"])
    with pytest.raises(ExpressionError, match=r"both sides have non-key column\(s\) \['value'\]"):
        stream.join(clash, on="customer_id")


def test_a_stream_on_the_other_side_makes_a_stream_stream_join() -> None:
    # (tests/core/transforms/test_stream_join.py covers those joins)
    from headrace.transforms.stream_join import StreamStreamJoinOperator

    stream = hr.read_stream.format("memory").option("name", "x").load()
    joined = stream.join(stream, on="customer_id")
    assert [type(op) for op in joined._steps] == [StreamStreamJoinOperator]
    assert len(joined._sources) == 2


def test_snapshot_semantics_with_a_delta_dimension_table(tmp_path: Path) -> None:
    # the seeds/004 example as written there: facts streamed, customers read from a Delta table
    deltalake = pytest.importorskip("deltalake")  # the headrace-delta plugin's library
    path = str(tmp_path / "customers")
    deltalake.write_deltalake(path, pa.table({"customer_id": [1, 2], "name": ["Bilal", "Olga"]}))
    tx = memory_stream(f"tx-{uuid.uuid4().hex[:6]}", pa.schema([("customer_id", pa.int64()), ("value", pa.int64())]))
    report = (hr.read_stream.format("memory").option("name", tx.name).load()
              .join(hr.read.format("delta").load(path), on="customer_id"))  # fmt: skip
    out = f"sales-{uuid.uuid4().hex[:6]}"

    def run_once() -> None:
        q = (report.write_stream.format("memory").query_name(out).option("checkpointLocation", str(tmp_path / "chk"))
             .trigger(processing_time="10 milliseconds").start())  # fmt: skip
        try:
            tx.add([{"customer_id": 3, "value": len(tx) * 100}, {"customer_id": 1, "value": len(tx) * 100 + 1}])
            q.process_all_available(30)
            deltalake.write_deltalake(path, pa.table({"customer_id": [3], "name": ["Zoya"]}), mode="append")
            q.process_all_available(30)
        finally:
            q.stop()

    run_once()
    assert rows(hr.memory_table(out)) == [(1, 1, "Bilal")]  # Zoya was added after the start
    run_once()
    assert rows(hr.memory_table(out)) == [(1, 1, "Bilal"), (1, 101, "Bilal"), (3, 100, "Zoya")]


def test_import_headrace_does_not_import_duckdb() -> None:
    import subprocess
    import sys

    code = "import sys, headrace; assert 'duckdb' not in sys.modules and 'pyarrow.compute' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
