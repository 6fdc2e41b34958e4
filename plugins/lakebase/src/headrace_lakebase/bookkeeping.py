"""The exactly-once bookkeeping table, ``<schema>._headrace_lakebase_commits``.

One row per flushed chunk, inserted in the same transaction as the chunk's rows::

    target     text     -- 'schema.table' written to
    query_id   text     -- the streaming query's id (stable across restarts of one checkpoint)
    batch_id   bigint   -- the micro-batch id
    writer     text     -- which write() call of the batch: '<task>:<first-row hash>'
    chunk      integer  -- chunk number within that writer's input, from 0
    row_start  bigint   -- the chunk holds input rows [row_start, row_end) of that writer
    row_end    bigint
    committed_at timestamptz
    PRIMARY KEY (target, query_id, batch_id, writer, chunk)

A replayed ``write`` first reads how far its writer got (``max(row_end)``) and skips that many
input rows, and each chunk's transaction begins by inserting its row with ``ON CONFLICT DO
NOTHING``: a chunk already recorded (e.g. committed just before a lost connection) is skipped.
So rows are written exactly once with or without upsert keys, whatever the chunk boundaries
(which depend on timing through ``batchinterval``) were in the first attempt.

``commit(n)`` records batch ``n`` as committed (a row with writer ``#committed``, chunk -1) and,
in the same transaction, deletes the rows of the query's earlier batches, so the table stays
small: per target and query, the chunks of the last committed batch and its mark. The mark is
what a replay after ``headrace checkpoint reset`` needs: the engine then replays rolled-back
batches ``<= n`` whose chunk rows are gone, and in insert mode (no keys) the sink skips any batch
at or below the mark, as the delta and files sinks skip committed batch ids (see
docs/decisions.md#lakebase-connector).
"""

from __future__ import annotations

from typing import NamedTuple

import psycopg
from psycopg import sql

__all__ = ["BOOKKEEPING_TABLE", "COMMITTED", "Bookkeeping", "Progress", "create_table_once"]

BOOKKEEPING_TABLE = "_headrace_lakebase_commits"
COMMITTED = "#committed"
"""The writer of a batch's commit mark (chunk -1): not a real writer id (those are ``task:hash``)."""


class Progress(NamedTuple):
    """What the bookkeeping says about one writer of one batch."""

    rows: int  # input rows of this writer already written
    next_chunk: int  # the chunk number to use next
    committed: int | None  # the query's last committed batch id on this target, None before any


def create_table_once(conn: psycopg.Connection[tuple[object, ...]], ddl: sql.Composed) -> None:
    """Run a ``CREATE TABLE IF NOT EXISTS`` in its own transaction; a writer that loses the race
    to create it concurrently (unique violation in pg_type, or duplicate table) carries on."""
    try:
        with conn.transaction():
            conn.execute(ddl)
    except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
        pass  # created concurrently by another writer


class Bookkeeping:
    """SQL on the bookkeeping table of one schema, for one target table and query."""

    def __init__(self, schema: str, target: str, query_id: str) -> None:
        self.ident = sql.Identifier(schema, BOOKKEEPING_TABLE)
        self.target = target
        self.query_id = query_id

    def ensure(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        """Create the table if missing. Called once per sink instance, before the first chunk."""
        ddl = sql.SQL(
            """CREATE TABLE IF NOT EXISTS {t} (
                 target text NOT NULL, query_id text NOT NULL, batch_id bigint NOT NULL,
                 writer text NOT NULL, chunk integer NOT NULL,
                 row_start bigint NOT NULL, row_end bigint NOT NULL,
                 committed_at timestamptz NOT NULL DEFAULT now(),
                 PRIMARY KEY (target, query_id, batch_id, writer, chunk))"""
        ).format(t=self.ident)
        create_table_once(conn, ddl)

    def progress(self, conn: psycopg.Connection[tuple[object, ...]], batch_id: int, writer: str) -> Progress:
        """What ``writer`` of ``batch_id`` already wrote, and the query's last committed batch.
        Called once per ``write``."""
        with conn.transaction():
            row = conn.execute(
                sql.SQL(
                    "SELECT coalesce(max(row_end), 0), coalesce(max(chunk) + 1, 0), "
                    "(SELECT max(batch_id) FROM {t} WHERE target = %s AND query_id = %s AND writer = %s) "
                    "FROM {t} WHERE target = %s AND query_id = %s AND batch_id = %s AND writer = %s"
                ).format(t=self.ident),
                (self.target, self.query_id, COMMITTED, self.target, self.query_id, batch_id, writer),
            ).fetchone()
        assert row is not None
        rows, chunk, committed = row
        return Progress(int(rows), int(chunk), None if committed is None else int(committed))  # type: ignore[call-overload]

    def claim(
        self, cur: psycopg.Cursor[tuple[object, ...]], batch_id: int, writer: str, chunk: int, row_start: int, row_end: int
    ) -> bool:
        """Record a chunk inside its transaction; False when it was recorded before (skip it).
        Called once per chunk, first in its transaction."""
        cur.execute(
            sql.SQL(
                "INSERT INTO {t} (target, query_id, batch_id, writer, chunk, row_start, row_end) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
            ).format(t=self.ident),
            (self.target, self.query_id, batch_id, writer, chunk, row_start, row_end),
        )
        return cur.rowcount == 1

    def mark_committed(self, conn: psycopg.Connection[tuple[object, ...]], batch_id: int) -> None:
        """Record ``batch_id`` as committed and delete the rows of this query's earlier batches,
        in one transaction (a later mark, left by a run before a checkpoint reset, stays).
        Called once per commit; idempotent."""
        with conn.transaction():
            conn.execute(
                sql.SQL(
                    "INSERT INTO {t} (target, query_id, batch_id, writer, chunk, row_start, row_end) "
                    "VALUES (%s, %s, %s, %s, -1, 0, 0) ON CONFLICT DO NOTHING"
                ).format(t=self.ident),
                (self.target, self.query_id, batch_id, COMMITTED),
            )
            conn.execute(
                sql.SQL("DELETE FROM {t} WHERE target = %s AND query_id = %s AND batch_id < %s").format(t=self.ident),
                (self.target, self.query_id, batch_id),
            )
