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
(which depend on timing through ``batchinterval``) were in the first attempt. ``commit(n)``
deletes the rows of the query's batches before ``n`` (they can no longer be replayed), so the
table stays small.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

__all__ = ["BOOKKEEPING_TABLE", "Bookkeeping", "create_table_once"]

BOOKKEEPING_TABLE = "_headrace_lakebase_commits"


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

    def progress(self, conn: psycopg.Connection[tuple[object, ...]], batch_id: int, writer: str) -> tuple[int, int]:
        """``(rows already written, next chunk number)`` of ``writer`` in ``batch_id``.
        Called once per ``write``."""
        with conn.transaction():
            row = conn.execute(
                sql.SQL(
                    "SELECT coalesce(max(row_end), 0), coalesce(max(chunk) + 1, 0) FROM {t} "
                    "WHERE target = %s AND query_id = %s AND batch_id = %s AND writer = %s"
                ).format(t=self.ident),
                (self.target, self.query_id, batch_id, writer),
            ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])  # type: ignore[call-overload]

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

    def forget_before(self, conn: psycopg.Connection[tuple[object, ...]], batch_id: int) -> None:
        """Delete the rows of this query's batches before ``batch_id``. Called once per commit."""
        with conn.transaction():
            conn.execute(
                sql.SQL("DELETE FROM {t} WHERE target = %s AND query_id = %s AND batch_id < %s").format(t=self.ident),
                (self.target, self.query_id, batch_id),
            )
