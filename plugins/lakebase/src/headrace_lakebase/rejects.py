"""Rows the database rejects, under ``badRecordsPolicy`` drop / deadLetter (``headrace.badrecords``).

A chunk is written in one transaction. When the policy is set and PostgreSQL refuses the chunk
for its data (a constraint violation, a value out of range or of the wrong form: SQLSTATE
classes 22 and 23), the chunk is written again row by row, each row in a savepoint, inside the
same transaction: the rows that pass are kept, the ones that fail are recorded in
``<schema>._headrace_lakebase_rejects`` — in that same transaction, next to the chunk's
bookkeeping row. So a chunk's rejects are durable exactly when its rows are, and a replay that
skips the chunk (already written) still finds them: after the last chunk, ``write`` reads every
reject of its batch and writer back and reports them, and the engine dead-letters them with the
batch (one file per batch, replaced on a replay): each rejected row is dead-lettered exactly
once. ``commit(n)`` forgets the rejects of batches before ``n``, like the bookkeeping.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from headrace_lakebase.bookkeeping import create_table_once

__all__ = ["DATA_ERRORS", "ENCODE_ERRORS", "REJECTS_TABLE", "Rejects", "describe", "write_row_by_row"]

REJECTS_TABLE = "_headrace_lakebase_rejects"
# refused for the data, not for the connection: class 22 (data exception), 23 (integrity)
DATA_ERRORS: tuple[type[BaseException], ...] = (psycopg.errors.DataError, psycopg.errors.IntegrityError)
# a value the COPY encoder cannot encode for the column's type
ENCODE_ERRORS: tuple[type[BaseException], ...] = (ValueError, OverflowError, TypeError, pa.ArrowInvalid)


class Rejects:
    """SQL on the rejects table of one schema, for one target table and query."""

    def __init__(self, schema: str, target: str, query_id: str) -> None:
        self.ident = sql.Identifier(schema, REJECTS_TABLE)
        self.target = target
        self.query_id = query_id

    def ensure(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        """Create the table if missing. Called once per sink instance with a policy."""
        ddl = sql.SQL(
            """CREATE TABLE IF NOT EXISTS {t} (
                 target text NOT NULL, query_id text NOT NULL, batch_id bigint NOT NULL,
                 writer text NOT NULL, chunk integer NOT NULL, row_index integer NOT NULL,
                 error text NOT NULL, record text,
                 PRIMARY KEY (target, query_id, batch_id, writer, chunk, row_index))"""
        ).format(t=self.ident)
        create_table_once(conn, ddl)

    def record(self, cur: psycopg.Cursor[tuple[object, ...]], batch_id: int, writer: str, chunk: int,
               rejected: list[tuple[int, str, str]]) -> None:  # fmt: skip
        """Record a chunk's rejected rows, inside the chunk's transaction."""
        if not rejected:
            return
        cur.executemany(
            sql.SQL(
                "INSERT INTO {t} (target, query_id, batch_id, writer, chunk, row_index, error, record) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
            ).format(t=self.ident),
            [(self.target, self.query_id, batch_id, writer, chunk, i, err, rec) for i, err, rec in rejected],
        )

    def read(self, conn: psycopg.Connection[tuple[object, ...]], batch_id: int, writer: str) -> list[tuple[int, int, str, str]]:
        """``(chunk, row, error, record)`` of every row of ``writer`` in ``batch_id`` rejected so
        far (this run or an earlier one). Called once per ``write``."""
        with conn.transaction():
            rows = conn.execute(
                sql.SQL(
                    "SELECT chunk, row_index, error, record FROM {t} WHERE target = %s AND query_id = %s "
                    "AND batch_id = %s AND writer = %s ORDER BY chunk, row_index"
                ).format(t=self.ident),
                (self.target, self.query_id, batch_id, writer),
            ).fetchall()
        return [(int(c), int(i), str(e), str(r)) for c, i, e, r in rows]  # type: ignore[call-overload]

    def forget_before(self, conn: psycopg.Connection[tuple[object, ...]], batch_id: int) -> None:
        """Delete the rejects of this query's batches before ``batch_id``. Called once per commit."""
        with conn.transaction():
            conn.execute(
                sql.SQL("DELETE FROM {t} WHERE target = %s AND query_id = %s AND batch_id < %s").format(t=self.ident),
                (self.target, self.query_id, batch_id),
            )


def write_row_by_row(
    conn: psycopg.Connection[tuple[object, ...]],
    table: pa.Table,
    write_one: Callable[[pa.Table], None],
) -> list[tuple[int, str, str]]:
    """Write ``table`` one row at a time, each in a savepoint of the current transaction, with
    ``write_one`` (a one-row table); returns ``(row, error, record as JSON)`` of the rows
    refused for their data. Other errors propagate (the chunk is retried or the query fails)."""
    rejected: list[tuple[int, str, str]] = []
    for i in range(table.num_rows):
        one = table.slice(i, 1)
        try:
            with conn.transaction():
                write_one(one)
        except (*DATA_ERRORS, *ENCODE_ERRORS) as e:
            rejected.append((i, _message(e), json.dumps(one.to_pylist()[0], default=str, sort_keys=True)))
    return rejected


def _message(e: BaseException) -> str:
    if isinstance(e, psycopg.Error) and e.diag.message_primary:
        state = f" (SQLSTATE {e.sqlstate})" if e.sqlstate else ""
        detail = f": {e.diag.message_detail}" if e.diag.message_detail else ""
        return f"{e.diag.message_primary}{detail}{state}"
    return f"{type(e).__name__}: {e}"


def describe(records: list[tuple[int, int, str, str]], table: Any, batch_id: int, writer: str) -> list[Any]:
    """The rejects as ``headrace.badrecords.BadRecord`` (location: table, batch, writer, chunk, row)."""
    from headrace.helpers.badrecords import BadRecord

    return [BadRecord(f"{table} batch {batch_id} writer {writer} chunk {c} row {i}", err, rec) for c, i, err, rec in records]
