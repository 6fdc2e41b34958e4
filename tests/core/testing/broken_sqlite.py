"""Ten deliberately broken versions of the example SQLite plugin (examples/headrace-sqlite), one
bug each, registered as connectors ``broken-*`` through ``HEADRACE_PLUGINS`` so the contract kit
can be run against them (tests/core/testing/test_kit.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from headrace.engine.crash import crash_point
from headrace.plugins import ConnectorSpec, hookimpl
from headrace.protocols import CommitMessage, Offset, Partition, ReadLimit
from headrace_sqlite._options import SINK_OPTIONS, SOURCE_OPTIONS
from headrace_sqlite.sink import SqliteSink, StagedRows
from headrace_sqlite.source import KeyRange, SqliteSource, _connect

_BOOK = "CREATE TABLE IF NOT EXISTS _headrace_commits (query_id TEXT, batch_id INTEGER, PRIMARY KEY (query_id, batch_id))"


def _tables(messages: Sequence[CommitMessage | None]) -> list[pa.Table]:
    return [pa.ipc.open_stream(m.ipc).read_all() for m in messages if isinstance(m, StagedRows) and m.rows]


# ------------------------------------------------------------------------------------ sinks
class ReplayNotSkippedSink(SqliteSink):
    """Records the batch id but never checks it: a replayed batch is written again."""

    def commit(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        with sqlite3.connect(self.path) as conn:
            conn.execute(_BOOK)
            for t in _tables(messages):
                self._insert(conn, t)
            conn.execute("INSERT OR IGNORE INTO _headrace_commits VALUES (?, ?)", (self.context.query_id, batch_id))


class RunKeyedSink(SqliteSink):
    """Keys its bookkeeping by the run id, which changes at every restart."""

    def commit(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        with sqlite3.connect(self.path) as conn:
            conn.execute(_BOOK)
            key = self.context.run_id
            if conn.execute("SELECT 1 FROM _headrace_commits WHERE query_id = ? AND batch_id = ?", (key, batch_id)).fetchone():
                return
            for t in _tables(messages):
                self._insert(conn, t)
            conn.execute("INSERT INTO _headrace_commits VALUES (?, ?)", (key, batch_id))


class WritesBeforeCommitSink(SqliteSink):
    """Inserts the rows in write(): they are visible before commit."""

    def write(self, batch_id: int, data: Iterator[pa.RecordBatch]) -> CommitMessage | None:
        batches = list(data)
        if batches:
            with sqlite3.connect(self.path) as conn:
                self._insert(conn, pa.Table.from_batches(batches))
        return StagedRows(b"", 0)

    def commit(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        with sqlite3.connect(self.path) as conn:
            conn.execute(_BOOK)
            conn.execute("INSERT OR IGNORE INTO _headrace_commits VALUES (?, ?)", (self.context.query_id, batch_id))


class FirstWriterOnlySink(SqliteSink):
    """Commits only the first message (as if there were always one writer)."""

    def commit(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        super().commit(batch_id, list(messages)[:1])


class SeparateTransactionSink(SqliteSink):
    """Commits the rows, then the bookkeeping in a second transaction."""

    def commit(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        conn = sqlite3.connect(self.path)
        try:
            conn.execute(_BOOK)
            conn.commit()
            if conn.execute("SELECT 1 FROM _headrace_commits WHERE query_id = ? AND batch_id = ?",
                            (self.context.query_id, batch_id)).fetchone():  # fmt: skip
                return
            for t in _tables(messages):
                self._insert(conn, t)
            conn.commit()
            crash_point("sqlite_between_data_and_bookkeeping", batch_id)
            conn.execute("INSERT INTO _headrace_commits VALUES (?, ?)", (self.context.query_id, batch_id))
            conn.commit()
        finally:
            conn.close()


# ------------------------------------------------------------------------------------ sources
def _read(source: SqliteSource, p: KeyRange, where: str, params: tuple[Any, ...]) -> Iterator[pa.RecordBatch]:
    conn = _connect(p.path)
    try:
        rows = conn.execute(f'SELECT * FROM "{p.table}" WHERE {where} ORDER BY "{p.key}"', params).fetchall()
    finally:
        conn.close()
    if rows:
        cols = list(zip(*rows, strict=True))
        yield pa.RecordBatch.from_arrays([pa.array(c, type=f.type) for c, f in zip(cols, source.schema, strict=True)],
                                         schema=source.schema)  # fmt: skip


class IgnoresLimitSource(SqliteSource):
    """Returns everything available, whatever the read limit."""

    def latest_offset(self, start: Offset, limit: ReadLimit) -> Offset:
        return super().latest_offset(start, ReadLimit.all_available())


class OffByOneSource(SqliteSource):
    """Reads its end key too (``<=`` where ``<`` belongs)."""

    def read(self, partition: Partition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KeyRange)
        return _read(self, partition, f'"{partition.key}" >= ? AND "{partition.key}" <= ?', (partition.lo, partition.hi))


class ReadsPastEndSource(SqliteSource):
    """Reads from its start to the end of the table, not to the partition's end."""

    def read(self, partition: Partition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KeyRange)
        return _read(self, partition, f'"{partition.key}" >= ?', (partition.lo,))


@dataclass(frozen=True)
class ConnectedRange(KeyRange):
    conn: Any = None


class UnpicklablePartitionSource(SqliteSource):
    """Hands out partitions that hold an open connection."""

    def partitions(self, start: Offset, end: Offset) -> Sequence[Partition]:
        return [ConnectedRange(p.path, p.table, p.key, p.lo, p.hi, _connect(p.path))
                for p in super().partitions(start, end) if isinstance(p, KeyRange)]  # fmt: skip


class IgnoresAvailableNowSource(SqliteSource):
    """Says it supports available-now but keeps reading what arrives later."""

    def prepare_for_available_now(self) -> bool:
        return True


# ------------------------------------------------------------------------------------ registration
_SINKS = {"replay-not-skipped": ReplayNotSkippedSink, "run-keyed": RunKeyedSink, "writes-before-commit": WritesBeforeCommitSink,
          "first-writer-only": FirstWriterOnlySink, "separate-transaction": SeparateTransactionSink}  # fmt: skip
_SOURCES = {"ignores-limit": IgnoresLimitSource, "off-by-one": OffByOneSource, "reads-past-end": ReadsPastEndSource,
            "unpicklable-partition": UnpicklablePartitionSource, "ignores-available-now": IgnoresAvailableNowSource}  # fmt: skip


@hookimpl
def headrace_connectors() -> list[ConnectorSpec]:
    specs = [ConnectorSpec(name=f"broken-{k}", sink=f"{__name__}:{c.__name__}", sink_options=SINK_OPTIONS) for k, c in _SINKS.items()]
    specs += [ConnectorSpec(name=f"broken-{k}", source=f"{__name__}:{c.__name__}", source_options=SOURCE_OPTIONS)
              for k, c in _SOURCES.items()]  # fmt: skip
    return specs
