"""Deliberately broken versions of the example SQLite plugin (examples/headrace-sqlite), one
bug each, registered as connectors ``broken-*`` through ``HEADRACE_PLUGINS`` so the contract kit
can be run against them (tests/core/testing/test_kit.py)."""

from __future__ import annotations

import logging
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

log = logging.getLogger(__name__)

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


class ChunkedCommitSink(SqliteSink):
    """Inserts its rows in chunks of 100, each in its own transaction, and records the batch id
    with the last chunk: a kill between two chunks leaves rows that the replay writes again."""

    def commit(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        conn = sqlite3.connect(self.path)
        try:
            conn.execute(_BOOK)
            conn.commit()
            if conn.execute("SELECT 1 FROM _headrace_commits WHERE query_id = ? AND batch_id = ?",
                            (self.context.query_id, batch_id)).fetchone():  # fmt: skip
                return
            tables = _tables(messages)
            rows = pa.concat_tables(tables) if tables else None
            chunks = [rows.slice(i, 100) for i in range(0, rows.num_rows, 100)] if rows is not None else []
            for t in chunks:
                self._insert(conn, t)
                if t is chunks[-1]:
                    conn.execute("INSERT INTO _headrace_commits VALUES (?, ?)", (self.context.query_id, batch_id))
                conn.commit()
            if not chunks:
                conn.execute("INSERT INTO _headrace_commits VALUES (?, ?)", (self.context.query_id, batch_id))
                conn.commit()
        finally:
            conn.close()


class SwallowsCommitErrorSink(SqliteSink):
    """Logs a failed commit and returns as if it had succeeded."""

    def commit(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        try:
            super().commit(batch_id, messages)
        except Exception as e:
            log.warning("commit of batch %d failed: %s", batch_id, e)


class BatchKeyedSink(SqliteSink):
    """Records the committed batch ids without the query id: a second query writing into the
    same table skips every batch id the first one committed."""

    def commit(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        with sqlite3.connect(self.path) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS _batches (batch_id INTEGER PRIMARY KEY)")
            if conn.execute("SELECT 1 FROM _batches WHERE batch_id = ?", (batch_id,)).fetchone():
                return
            for t in _tables(messages):
                self._insert(conn, t)
            conn.execute("INSERT INTO _batches VALUES (?)", (batch_id,))


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


class PerPartitionLimitSource(SqliteSource):
    """Applies max_rows to each of its key ranges: batches of numPartitions times the limit."""

    def latest_offset(self, start: Offset, limit: ReadLimit) -> Offset:
        if limit.max_rows is None:
            return super().latest_offset(start, limit)
        return super().latest_offset(start, ReadLimit(max_rows=limit.max_rows * self.num_partitions))


class RoundsPastLimitSource(SqliteSource):
    """Rounds the end of a limited batch up to the next multiple of 10 keys."""

    def latest_offset(self, start: Offset, limit: ReadLimit) -> Offset:
        end = int(super().latest_offset(start, limit)["next"])
        if limit.max_rows is None or end == int(start["next"]):
            return {"next": end}
        top = self._max_key() + 1 if self._cap is None else self._cap
        return {"next": min(-(-end // 10) * 10, top)}


class PageRereadSource(SqliteSource):
    """Reads a range in pages of 1,000 rows, each page starting at the last key of the one
    before, inclusive: the row at every page boundary is read twice."""

    def read(self, partition: Partition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KeyRange)
        key = self.schema.get_field_index(partition.key)
        conn = _connect(partition.path)
        try:
            lo = partition.lo
            while True:
                rows = conn.execute(f'SELECT * FROM "{partition.table}" WHERE "{partition.key}" >= ? AND '
                                    f'"{partition.key}" < ? ORDER BY "{partition.key}" LIMIT 1000',
                                    (lo, partition.hi)).fetchall()  # fmt: skip
                if not rows:
                    return
                cols = list(zip(*rows, strict=True))
                yield pa.RecordBatch.from_arrays([pa.array(c, type=f.type) for c, f in zip(cols, self.schema, strict=True)],
                                                 schema=self.schema)  # fmt: skip
                if len(rows) < 1000:
                    return
                lo = rows[-1][key]  # the bug: the next page starts AT the last key read
        finally:
            conn.close()


class CommitsAheadSource(SqliteSource):
    """Source.commit(end) deletes every row up to the furthest end latest_offset handed out,
    not only those before ``end``: rows of batches planned ahead are gone before they are read."""

    def latest_offset(self, start: Offset, limit: ReadLimit) -> Offset:
        end = super().latest_offset(start, limit)
        self._handed = max(getattr(self, "_handed", 0), int(end["next"]))
        return end

    def commit(self, end: Offset) -> None:
        with sqlite3.connect(self.path) as conn:
            conn.execute(f'DELETE FROM "{self.table}" WHERE "{self.key}" < ?', (getattr(self, "_handed", 0),))


class InferredSchemaSource(SqliteSource):
    """Declares ``value`` as int32, but builds its batches from the rows' Python values (an
    inferred schema: int64)."""

    @property
    def schema(self) -> pa.Schema:
        declared = super().schema
        i = declared.get_field_index("value")
        return declared.set(i, pa.field("value", pa.int32())) if i >= 0 else declared

    def read(self, partition: Partition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KeyRange)
        conn = _connect(partition.path)
        try:
            cur = conn.execute(f'SELECT * FROM "{partition.table}" WHERE "{partition.key}" >= ? AND "{partition.key}" < ?',
                               (partition.lo, partition.hi))  # fmt: skip
            names = [d[0] for d in cur.description]
            rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
        finally:
            conn.close()
        if rows:
            yield pa.RecordBatch.from_pylist(rows)


class MutatesStartSource(SqliteSource):
    """Moves the start offset it is given forward in place (a cursor kept in the offset)."""

    def latest_offset(self, start: Offset, limit: ReadLimit) -> Offset:
        end = super().latest_offset(start, limit)
        start["next"] = end["next"]
        return dict(end)


# ------------------------------------------------------------------------------------ registration
_SINKS = {"replay-not-skipped": ReplayNotSkippedSink, "run-keyed": RunKeyedSink, "writes-before-commit": WritesBeforeCommitSink,
          "first-writer-only": FirstWriterOnlySink, "separate-transaction": SeparateTransactionSink,
          "chunked-commit": ChunkedCommitSink, "swallows-commit-error": SwallowsCommitErrorSink,
          "batch-keyed": BatchKeyedSink}  # fmt: skip
_SOURCES = {"ignores-limit": IgnoresLimitSource, "off-by-one": OffByOneSource, "reads-past-end": ReadsPastEndSource,
            "unpicklable-partition": UnpicklablePartitionSource, "ignores-available-now": IgnoresAvailableNowSource,
            "per-partition-limit": PerPartitionLimitSource, "rounds-past-limit": RoundsPastLimitSource,
            "page-reread": PageRereadSource, "commits-ahead": CommitsAheadSource,
            "inferred-schema": InferredSchemaSource, "mutates-start": MutatesStartSource}  # fmt: skip


@hookimpl
def headrace_connectors() -> list[ConnectorSpec]:
    specs = [ConnectorSpec(name=f"broken-{k}", sink=f"{__name__}:{c.__name__}", sink_options=SINK_OPTIONS) for k, c in _SINKS.items()]
    specs += [ConnectorSpec(name=f"broken-{k}", source=f"{__name__}:{c.__name__}", source_options=SOURCE_OPTIONS)
              for k, c in _SOURCES.items()]  # fmt: skip
    return specs
