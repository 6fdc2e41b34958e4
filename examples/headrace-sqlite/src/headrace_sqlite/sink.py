"""The ``sqlite`` sink: appends each micro-batch to a SQLite table, exactly once.

``write`` only stages: it returns the batch's rows (Arrow IPC bytes) in its commit message, and
nothing is visible yet. ``commit`` inserts the rows of every message AND records
``(query_id, batch_id)`` in the table ``_headrace_commits``, in ONE transaction; a batch id
already recorded for this query is skipped, so a batch replayed after a crash is written once.
(A sink for large batches would stage rows in the target system instead and keep only their
location in the message.)
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from headrace.engine.crash import crash_point
from headrace.errors import HeadraceError
from headrace.options import Options
from headrace.protocols import CommitMessage, Sink, SinkContext
from headrace_sqlite._options import PATH, TABLE

__all__ = ["StagedRows", "SqliteSink"]

_SQL_TYPES = {"int": "INTEGER", "uint": "INTEGER", "bool": "INTEGER", "float": "REAL", "double": "REAL", "halffloat": "REAL"}


@dataclass(frozen=True)
class StagedRows(CommitMessage):
    """One writer's rows, as Arrow IPC stream bytes: plain data, so it pickles."""

    ipc: bytes
    rows: int


def _q(name: str) -> str:
    """A quoted SQL identifier (a column name from the data may hold any character)."""
    return '"' + name.replace('"', '""') + '"'


def _sql_type(t: pa.DataType) -> str:
    name = str(t)
    for prefix, sql in _SQL_TYPES.items():
        if name.startswith(prefix):
            return sql
    return "BLOB" if pa.types.is_binary(t) or pa.types.is_large_binary(t) else "TEXT"


def _plain(col: pa.ChunkedArray) -> list[object]:
    t = col.type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_string(t) \
            or pa.types.is_binary(t):  # fmt: skip
        return col.to_pylist()
    return col.cast(pa.string()).to_pylist()  # timestamps, decimals, ...: their text form


class SqliteSink(Sink):
    """Appends rows to a SQLite table; idempotent per (query id, batch id)."""

    idempotent_commit = True

    def __init__(self, options: Options, context: SinkContext) -> None:
        """Called once per query run on the driver (and once per task under Spark): cheap, no writes."""
        super().__init__(options, context)
        self.path = options[PATH]
        self.table = options[TABLE]

    def write(self, batch_id: int, data: Iterator[pa.RecordBatch]) -> CommitMessage | None:
        """Stage one share of a batch: collect its rows into the commit message; nothing becomes
        visible. Called once per batch (once per Spark task), possibly in another process."""
        sink = pa.BufferOutputStream()
        writer: pa.ipc.RecordBatchStreamWriter | None = None
        rows = 0
        for batch in data:
            if writer is None:
                writer = pa.ipc.new_stream(sink, batch.schema)
            writer.write_batch(batch)
            rows += batch.num_rows
        if writer is None:
            return StagedRows(b"", 0)
        writer.close()
        return StagedRows(sink.getvalue().to_pybytes(), rows)

    def commit(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        """Insert every message's rows and record the batch id, in one transaction; skip a batch
        id this query already committed. Called once per batch on the driver, again for the same
        batch id after a crash."""
        tables = [pa.ipc.open_stream(m.ipc).read_all() for m in messages if isinstance(m, StagedRows) and m.rows]
        conn = sqlite3.connect(self.path, timeout=30)
        try:
            with conn:  # one transaction: the rows and the bookkeeping, or neither
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("CREATE TABLE IF NOT EXISTS _headrace_commits "
                             "(query_id TEXT NOT NULL, batch_id INTEGER NOT NULL, PRIMARY KEY (query_id, batch_id))")  # fmt: skip
                done = conn.execute("SELECT 1 FROM _headrace_commits WHERE query_id = ? AND batch_id = ?",
                                    (self.context.query_id, batch_id)).fetchone()  # fmt: skip
                if done:
                    return  # a replay of a committed batch: written once already
                for table in tables:
                    self._insert(conn, table)
                # a kill here must leave neither the rows nor the record (the contract kit kills here)
                crash_point("sqlite_between_data_and_bookkeeping", batch_id)
                conn.execute("INSERT INTO _headrace_commits VALUES (?, ?)", (self.context.query_id, batch_id))
        except sqlite3.Error as e:
            raise HeadraceError(f"sqlite: committing batch {batch_id} to {self.path} failed: {e}") from e
        finally:
            conn.close()

    def _insert(self, conn: sqlite3.Connection, table: pa.Table) -> None:
        names = table.column_names
        cols = ", ".join(f"{_q(n)} {_sql_type(table.schema.field(n).type)}" for n in names)
        conn.execute(f"CREATE TABLE IF NOT EXISTS {_q(self.table)} ({cols})")
        values = [_plain(table.column(n)) for n in names]
        conn.executemany(
            f"INSERT INTO {_q(self.table)} ({', '.join(_q(n) for n in names)}) VALUES ({', '.join('?' for _ in names)})",
            zip(*values, strict=True),
        )

    def abort(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        """Nothing to undo: staged rows live only in the messages. Called at most once per failed batch."""

    def close(self) -> None:
        """Nothing held between calls. Called once when the query stops; idempotent."""
