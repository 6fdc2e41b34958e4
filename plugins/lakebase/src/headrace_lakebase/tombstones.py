"""Delete tombstones of the ``lakebase`` sink's AUTO CDC mode (with ``sequenceBy``).

A delete removes the row, so without more an older event of the key arriving in a later batch
(out of order) would bring it back. The sink keeps, per target table, a bookkeeping table of
deleted keys with the sequence of their latest delete, ``<schema>._headrace_tomb_<table>``::

    <key columns>   -- the target's key columns, same types (primary key)
    __headrace_seq  -- the sequence value of the key's latest delete (the sequenceBy type)
    deleted_at      timestamptz  -- when that delete was applied (server clock)

In each chunk's transaction (with the chunk's bookkeeping row, so a replay changes nothing)
the chunk's latest event of each key is copied into a session temp table (keys, sequence,
delete flag); then upserts strictly older than the key's tombstone are dropped from the staging
table, deletes not newer than it are ignored, the other deletes are applied and recorded
(``ON CONFLICT`` keeps the highest sequence). Tombstones older than ``tombstoneRetention`` are
deleted after a commit, at most once a minute (Databricks keeps tombstones for
``pipelines.cdc.tombstoneGCThresholdInSeconds``). Identifiers are validated by the options and
quoted with ``psycopg.sql.Identifier``; values are bound or copied.
"""

from __future__ import annotations

import hashlib
import logging
import time

import psycopg
import pyarrow as pa
from psycopg import sql

from headrace_lakebase._options import TableName
from headrace_lakebase.pgtypes import arrow_to_pg
from headrace_lakebase.table import TablePlan

__all__ = ["DEL_COLUMN", "GC_EVERY", "SEQ_COLUMN", "Tombstones", "collect_due", "tombstone_table_name"]

SEQ_COLUMN = "__headrace_seq"
DEL_COLUMN = "__headrace_del"
GC_EVERY = 60.0
"""Seconds between two garbage collections of expired tombstones by one sink."""
_BOOL_OID = 16

log = logging.getLogger(__name__)

Conn = psycopg.Connection[tuple[object, ...]]


def tombstone_table_name(table: str) -> str:
    """``_headrace_tomb_<table>``, shortened with a hash when over PostgreSQL's 63 bytes."""
    name = f"_headrace_tomb_{table}"
    if len(name.encode()) <= 63:
        return name
    return f"_headrace_tomb_{table[:36]}_{hashlib.sha1(table.encode()).hexdigest()[:10]}"


class Tombstones:
    """The SQL of one target's tombstones. Built once per sink (keys and the sequence type
    known from the first batch); no I/O before :meth:`ensure`."""

    def __init__(self, plan: TablePlan, seq_type: pa.DataType) -> None:
        self.plan = plan
        self.keys = list(plan.keys)
        self.seq_pg = arrow_to_pg(seq_type)
        self.name = tombstone_table_name(plan.table.table)
        self.ident = sql.Identifier(plan.table.schema, self.name)
        self.events = sql.Identifier(f"_headrace_tomb_ev_{abs(hash((plan.table, plan.keys))) % 10**12}")
        self.seq_oid: int | None = None

    # ------------------------------------------------------------------ helpers
    def _keys(self) -> sql.Composable:
        return sql.SQL(", ").join(map(sql.Identifier, self.keys))

    def _match(self, a: str, b: str) -> sql.Composable:
        return sql.SQL(" AND ").join(
            sql.SQL("{a}.{k} = {b}.{k}").format(a=sql.Identifier(a), b=sql.Identifier(b), k=sql.Identifier(k))
            for k in self.keys
        )

    @property
    def event_columns(self) -> list[str]:
        return [*self.keys, SEQ_COLUMN, DEL_COLUMN]

    def event_oids(self, key_oids: list[int]) -> list[int]:
        assert self.seq_oid is not None, "Tombstones.ensure() first"
        return [*key_oids, self.seq_oid, _BOOL_OID]

    # ------------------------------------------------------------------ DDL
    def ensure(self, conn: Conn) -> None:
        """Create the tombstone table when missing (keys typed as the target's) and read the
        sequence column's type oid. Called once per sink, before the first chunk."""
        regclass = f"{self.plan.table.schema}.{self.name}"  # plain identifiers (validated dbtable)
        try:
            with conn.transaction():
                exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (regclass,)).fetchone()
                if exists is not None and not exists[0]:
                    conn.execute(sql.SQL(
                        "CREATE TABLE {t} AS SELECT {keys}, NULL::{seq} AS {s}, now() AS deleted_at FROM {target} WITH NO DATA"
                    ).format(t=self.ident, keys=self._keys(), seq=sql.SQL(self.seq_pg), s=sql.Identifier(SEQ_COLUMN),
                             target=self.plan.ident))  # fmt: skip
                    conn.execute(sql.SQL("ALTER TABLE {t} ADD PRIMARY KEY ({keys}), ALTER COLUMN deleted_at SET NOT NULL, "
                                         "ALTER COLUMN deleted_at SET DEFAULT now()").format(t=self.ident, keys=self._keys()))  # fmt: skip
                    conn.execute(sql.SQL("CREATE INDEX ON {t} (deleted_at)").format(t=self.ident))
                    conn.execute(sql.SQL("COMMENT ON TABLE {t} IS {c}").format(
                        t=self.ident, c=sql.Literal(f"headrace: delete tombstones of {self.plan.table} (AUTO CDC)")))  # fmt: skip
        except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
            pass  # created concurrently by another writer
        row = conn.execute("SELECT atttypid::int FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = %s",
                           (regclass, SEQ_COLUMN)).fetchone()  # fmt: skip
        if row is None:
            raise psycopg.errors.UndefinedColumn(f"the tombstone table {regclass} has no {SEQ_COLUMN} column; drop it")
        self.seq_oid = int(row[0])  # type: ignore[call-overload]

    def create_events(self) -> sql.Composed:
        """A session temp table of a chunk's latest events: keys, sequence, delete flag."""
        return sql.SQL(
            "CREATE TEMP TABLE IF NOT EXISTS {e} ON COMMIT DELETE ROWS AS "
            "SELECT {keys}, {s}, false AS {d} FROM {t} WITH NO DATA"
        ).format(e=self.events, keys=self._keys(), s=sql.Identifier(SEQ_COLUMN), d=sql.Identifier(DEL_COLUMN), t=self.ident)

    # ------------------------------------------------------------------ per chunk, in its transaction
    def copy_events(self) -> sql.Composed:
        return sql.SQL("COPY {e} ({cols}) FROM STDIN (FORMAT BINARY)").format(
            e=self.events, cols=sql.SQL(", ").join(map(sql.Identifier, self.event_columns))
        )

    def drop_tombstoned_upserts(self, stage: str) -> sql.Composed:
        """Remove from the upsert staging table ``stage`` the events older than their key's tombstone."""
        return sql.SQL(
            "DELETE FROM {stage} s USING {e} e, {t} b WHERE NOT e.{d} AND {se} AND {be} AND e.{s} < b.{s}"
        ).format(stage=sql.Identifier(stage), e=self.events, t=self.ident, d=sql.Identifier(DEL_COLUMN),
                 se=self._match("s", "e"), be=self._match("b", "e"), s=sql.Identifier(SEQ_COLUMN))  # fmt: skip

    def delete_target(self, seq_col: str | None) -> sql.Composed:
        """Apply the chunk's deletes not older than their key's tombstone (and, when the target
        keeps the sequence column, not older than the stored row)."""
        guard: sql.Composable = sql.SQL("")
        if seq_col:
            guard = sql.SQL(" AND (t.{c} IS NULL OR t.{c} <= e.{s})").format(c=sql.Identifier(seq_col), s=sql.Identifier(SEQ_COLUMN))
        return sql.SQL(
            "DELETE FROM {target} t USING {e} e WHERE e.{d} AND {te}{guard} "
            "AND NOT EXISTS (SELECT 1 FROM {tb} b WHERE {be} AND b.{s} >= e.{s})"
        ).format(target=self.plan.ident, e=self.events, d=sql.Identifier(DEL_COLUMN), te=self._match("t", "e"), guard=guard,
                 tb=self.ident, be=self._match("b", "e"), s=sql.Identifier(SEQ_COLUMN))  # fmt: skip

    def record(self) -> sql.Composed:
        """Record the chunk's deletes as tombstones, keeping each key's highest sequence."""
        return sql.SQL(
            "INSERT INTO {t} AS b ({keys}, {s}, deleted_at) SELECT {keys}, {s}, now() FROM {e} WHERE {d} "
            "ON CONFLICT ({keys}) DO UPDATE SET {s} = EXCLUDED.{s}, deleted_at = EXCLUDED.deleted_at WHERE b.{s} < EXCLUDED.{s}"
        ).format(t=self.ident, keys=self._keys(), s=sql.Identifier(SEQ_COLUMN), e=self.events, d=sql.Identifier(DEL_COLUMN))


def collect_due(conn: Conn, table: TableName, retention: float, last: float | None) -> float | None:
    """Delete the tombstones of ``table`` older than ``retention`` seconds when the last
    collection (a ``time.monotonic()`` value; None: never) is :data:`GC_EVERY` seconds old;
    returns the new value. Called after each commit on the driver (needs only the table's
    name: under Spark the driver's sink never wrote). No tombstone table: nothing to do."""
    if last is not None and time.monotonic() - last < GC_EVERY:
        return last
    ident = sql.Identifier(table.schema, tombstone_table_name(table.table))
    try:
        with conn.transaction():
            cur = conn.execute(
                sql.SQL("DELETE FROM {t} WHERE deleted_at < now() - make_interval(secs => %s)").format(t=ident),
                (float(retention),),
            )
            gone = cur.rowcount
    except psycopg.errors.UndefinedTable:
        return time.monotonic()
    if gone:
        log.info("lakebase: %d tombstones of %s older than %s s removed", gone, table, retention)
    return time.monotonic()
