"""The stream API of the stateful operators (group_by/agg/count, drop_duplicates) as the engine
runs them, against DuckDB over all the input; output-mode errors with Spark's reasons.

The operators themselves (headrace.transforms.aggregate / dedup) and their state are tested
with their module; these tests need it and are skipped on a branch where it is not merged yet."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

import headrace as hr
from headrace.errors import UnsupportedError
from headrace.testing import memory_stream

pytest.importorskip("headrace.transforms.aggregate", reason="the state helper's operators are not merged in yet")

SCHEMA = pa.schema([("user", pa.string()), ("amount", pa.int64())])


def tables() -> list[pa.Table]:
    return [pa.table({"user": [f"u{(i * 7 + b) % 4}" for i in range(20)], "amount": [i + b for i in range(20)]},
                     schema=SCHEMA) for b in range(3)]  # fmt: skip


def run(frame_of: Callable[[hr.StreamFrame], hr.StreamFrame], mode: str, tmp_path: Path) -> tuple[pa.Table, pa.Table]:
    """Feed three batches one at a time through the plan; (output, all input)."""
    name = f"agg-{uuid.uuid4().hex[:6]}"
    stream = memory_stream(name, SCHEMA)
    frame = frame_of(hr.read_stream.format("memory").option("name", name).load())
    q = (frame.write_stream.format("memory").query_name(name + "-out").output_mode(mode)
         .option("checkpointLocation", str(tmp_path / "chk")).trigger(processing_time="10 milliseconds").start())  # fmt: skip
    try:
        for t in tables():
            stream.add(t)
            q.process_all_available(30)
    finally:
        q.stop()
    return hr.memory_table(name + "-out"), pa.concat_tables(tables())


def duck(table: pa.Table, query: str) -> list[tuple[object, ...]]:
    con = duckdb.connect()
    con.register("batch", table)
    return sorted(con.sql(query).fetchall())


@pytest.mark.parametrize("mode", ["update", "complete"])
def test_group_by_agg_matches_duckdb(mode: str, tmp_path: Path) -> None:
    out, everything = run(lambda s: s.group_by("user").agg(
        "count(*) AS n", "sum(amount) AS total", "min(amount) AS lo", "max(amount) AS hi"), mode, tmp_path)  # fmt: skip
    got = out.to_pylist()
    final: dict[str, tuple[object, ...]] = {}
    for r in got:  # update mode: the last row per key is its current value
        final[str(r["user"])] = (r["user"], r["n"], r["total"], r["lo"], r["hi"])
    want = duck(everything, "SELECT user, count(*), sum(amount), min(amount), max(amount) FROM batch GROUP BY user")
    assert sorted(final.values()) == want


def test_count_names_its_column_count(tmp_path: Path) -> None:
    out, everything = run(lambda s: s.group_by("user").count(), "complete", tmp_path)
    got = sorted((r["user"], r["count"]) for r in out.to_pylist())
    assert got == duck(everything, "SELECT user, count(*) FROM batch GROUP BY user")


def test_append_with_an_aggregation_and_no_watermark_is_refused_at_start() -> None:
    frame = hr.read_stream.format("memory").option("name", "x").schema(SCHEMA).load().group_by("user").count()
    with pytest.raises(UnsupportedError, match="(?i)append output mode not supported"):
        frame.write_stream.format("memory").query_name("agg-append").output_mode("append").start()


def test_two_aggregations_in_update_mode_are_refused_with_sparks_reason() -> None:
    # (chained aggregations run in append mode: tests/core/transforms/test_chained_operators.py)
    frame = (hr.read_stream.format("memory").option("name", "x").schema(SCHEMA).load().group_by("user").count()
             .group_by("count").count())  # fmt: skip
    with pytest.raises(UnsupportedError, match="possible 'correctness' issue due to global watermark"):
        frame.write_stream.format("memory").query_name("agg2").output_mode("update").start()


def test_drop_duplicates_matches_duckdb_distinct(tmp_path: Path) -> None:
    out, everything = run(lambda s: s.drop_duplicates("user"), "append", tmp_path)
    assert sorted(out.column("user").to_pylist()) == [
        r[0] for r in duck(everything, "SELECT DISTINCT user FROM batch")]  # fmt: skip



def test_drop_duplicates_within_watermark_gets_the_delay_from_the_plan(tmp_path: Path) -> None:
    import datetime as dt

    schema = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))])
    name = f"dw-{uuid.uuid4().hex[:6]}"
    stream = memory_stream(name, schema)
    t0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    frame = (hr.read_stream.format("memory").option("name", name).load().with_watermark("ts", "10 seconds")
             .drop_duplicates_within_watermark("id"))  # fmt: skip
    q = (frame.write_stream.format("memory").query_name(name + "-out").option("checkpointLocation", str(tmp_path))
         .trigger(processing_time="10 milliseconds").start())  # fmt: skip
    try:
        for rows in ([(1, 0), (2, 1), (1, 2)], [(2, 3), (3, 4)]):
            stream.add([{"id": i, "ts": t0 + dt.timedelta(seconds=s)} for i, s in rows])
            q.process_all_available(30)
    finally:
        q.stop()
    assert sorted(hr.memory_table(name + "-out").column("id").to_pylist()) == [1, 2, 3]
