"""A batch that yields no rows still reaches every built-in sink with the output schema: the
engine hands one empty batch of the source's schema (or of what ``map_batches`` makes of an
empty table), and the sinks keep it when they build tables."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import headrace as hr
from headrace.engine.crash import CrashHook
from headrace.engine.reader import BatchCounts, empty_output, read_partitions
from headrace.testing import memory_stream

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def empty_then_rows(name: str) -> str:
    """A memory stream whose first table has no rows (its partition yields no record batch)."""
    s = memory_stream(name, SCHEMA)
    s.add(pa.Table.from_pylist([], schema=SCHEMA))
    return name


def start(writer: Any, tmp_path: Path) -> hr.StreamingQuery:
    q = writer.option("checkpointLocation", str(tmp_path / "chk")).trigger(available_now=True).start()
    q.await_termination(30)
    assert q.exception() is None
    return q


def test_foreach_batch_gets_the_source_schema_for_an_empty_batch(tmp_path: Path) -> None:
    got: list[pa.Table] = []
    frame = hr.read_stream.format("memory").option("name", empty_then_rows(uuid.uuid4().hex)).load()
    start(frame.write_stream.foreach_batch(lambda t, _b: got.append(t)), tmp_path)
    assert len(got) == 1 and got[0].num_rows == 0 and got[0].schema == SCHEMA


def test_foreach_batch_gets_the_transformed_schema_when_nothing_passes(tmp_path: Path) -> None:
    got: list[pa.Table] = []

    def keep_none(t: pa.Table) -> pa.Table:
        return t.filter(pc.greater(t["value"], 1 << 40)).select(["value"]).append_column(
            "double", pc.multiply(t.filter(pc.greater(t["value"], 1 << 40))["value"], 2)
        )

    frame = hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=5, totalRows=10).load().map_batches(keep_none)
    start(frame.write_stream.foreach_batch(lambda t, _b: got.append(t)), tmp_path)
    assert [t.num_rows for t in got] == [0, 0]
    assert all(t.column_names == ["value", "double"] for t in got)


def test_memory_sink_keeps_the_schema_of_an_empty_batch(tmp_path: Path) -> None:
    name = uuid.uuid4().hex
    frame = hr.read_stream.format("memory").option("name", empty_then_rows(name)).load()
    start(frame.write_stream.format("memory").query_name(name), tmp_path)
    table = hr.memory_table(name)
    assert table.num_rows == 0 and table.schema == SCHEMA


def test_console_sink_prints_the_columns_of_an_empty_batch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    frame = hr.read_stream.format("memory").option("name", empty_then_rows(uuid.uuid4().hex)).load()
    start(frame.write_stream.format("console"), tmp_path)
    out = capsys.readouterr().out
    assert "Batch: 0" in out and "| id | name |" in out.replace("  ", " ")


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_files_and_noop_sinks_take_an_empty_batch(tmp_path: Path, fmt: str) -> None:
    frame = hr.read_stream.format("memory").option("name", empty_then_rows(uuid.uuid4().hex)).load()
    q = start(frame.write_stream.format("files").option("format", fmt).option("path", str(tmp_path / "out")), tmp_path)
    assert q.last_progress is not None and q.last_progress["numInputRows"] == 0
    assert (tmp_path / "out" / "_commits" / "0").read_text() == "0"
    frame = hr.read_stream.format("memory").option("name", empty_then_rows(uuid.uuid4().hex)).load()
    start(frame.write_stream.format("noop").option("checkpointLocation", str(tmp_path / "chk2")), tmp_path / "x")


def test_the_engine_hands_one_empty_batch_when_nothing_is_read() -> None:
    class Src:
        schema = SCHEMA

        def read(self, _p: Any) -> Iterator[pa.RecordBatch]:
            return iter(())

    counts = BatchCounts([0])
    out = list(read_partitions([Src()], [(0, object())], None, counts, batch_id=0, pool=None, crash=CrashHook()))  # type: ignore[list-item]
    assert len(out) == 1 and out[0].num_rows == 0 and out[0].schema == SCHEMA
    assert counts.output_rows == 0
    out = list(read_partitions([Src()], [], None, counts, batch_id=0, pool=None, crash=CrashHook()))  # type: ignore[list-item]
    assert [b.schema for b in out] == [SCHEMA]


def test_a_transform_that_fails_on_an_empty_table_gives_no_batch() -> None:
    class Src:
        schema = SCHEMA

    def first_row_only(t: pa.Table) -> pa.Table:
        return t.slice(0, 1).append_column("x", pa.array([t["id"][0].as_py()]))

    assert empty_output([Src()], first_row_only) is None  # type: ignore[list-item]
    assert empty_output([Src()], lambda t: t.select(["name"])).schema == pa.schema([("name", pa.string())])  # type: ignore[list-item, union-attr]
