"""AUTO CDC in the ``lakebase`` sink: a change stream applied to a keyed PostgreSQL table.

With ``sequenceBy`` or ``applyAsDeletes`` set, each incoming record batch is prepared by
:func:`headrace.helpers.auto_cdc.prepare` (``update_preimage`` rows dropped, the output
columns of ``columnList`` / ``exceptColumnList``, the sequence and the delete flag), then cut
into chunks as usual. Each chunk is applied in one transaction, with the bookkeeping row that
makes it exactly-once: the latest event of each key wins (highest sequence); upserts go through
the staging table (``ON CONFLICT ... DO UPDATE``), deletes through a second staging table of
keys (``DELETE ... USING``). When the target keeps the sequence column, an event older than the
stored row is ignored (out-of-order events across batches). With ``sequenceBy`` and a
``tombstoneRetention`` above 0, deletes leave tombstones (:mod:`headrace_lakebase.tombstones`)
so that an older event arriving after a delete does not bring the row back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from headrace.helpers.auto_cdc import DELETE, SEQ, AutoCdcSpec, last_per_key, prepare
from headrace.helpers.crash import crash_point
from headrace_lakebase.bookkeeping import Bookkeeping
from headrace_lakebase.buffer import Chunk
from headrace_lakebase.copy_binary import FAST_OIDS, SIGNATURE, TRAILER, encode_rows
from headrace_lakebase.table import TablePlan
from headrace_lakebase.tombstones import Tombstones

__all__ = ["cdc_batches", "chunk_work", "create_delete_staging", "delete_from_staging", "split_chunk", "upsert_guarded"]

Conn = psycopg.Connection[tuple[object, ...]]


def cdc_batches(data: Iterator[pa.RecordBatch], spec: AutoCdcSpec) -> Iterator[pa.RecordBatch]:
    """The input prepared for AUTO CDC, batch by batch (bounded memory). Without ``sequenceBy``
    the sequence is the event's position in the whole input (stream order), across batches."""
    position = 0
    for b in data:
        if not b.num_rows:
            continue
        t = prepare(pa.Table.from_batches([b]), spec, position)
        position += t.num_rows
        if t.num_rows:
            yield from t.combine_chunks().to_batches()


def split_chunk(table: pa.Table, keys: list[str]) -> tuple[pa.Table, pa.Table]:
    """A chunk of prepared events -> (rows to upsert, with SEQ; keys to delete, with SEQ), the
    latest event per key only."""
    latest = last_per_key(table, keys)
    is_delete = pc.fill_null(latest[DELETE], False)
    upserts = latest.filter(pc.invert(is_delete)).drop_columns([DELETE])
    deletes = latest.filter(is_delete).select([*keys, SEQ])
    return upserts, deletes


def delete_staging_name(plan: TablePlan) -> str:
    return plan.staging_name().replace("_stage_", "_delete_")


def create_delete_staging(plan: TablePlan, seq: str | None) -> sql.Composed:
    """A session-local table of the keys (and the stored sequence column) to delete."""
    cols = [*plan.keys, *([seq] if seq else [])]
    return sql.SQL(
        "CREATE TEMP TABLE IF NOT EXISTS {stage} ON COMMIT DELETE ROWS AS SELECT {cols} FROM {target} WITH NO DATA"
    ).format(stage=sql.Identifier(delete_staging_name(plan)), cols=sql.SQL(", ").join(map(sql.Identifier, cols)),
             target=plan.ident)  # fmt: skip


def delete_from_staging(plan: TablePlan, seq: str | None) -> sql.Composed:
    """``DELETE FROM target USING staging`` on the keys; only rows not newer than the event
    when the target keeps the sequence column."""
    match = sql.SQL(" AND ").join(
        sql.SQL("t.{k} = d.{k}").format(k=sql.Identifier(k)) for k in plan.keys
    )
    if seq:
        match = match + sql.SQL(" AND (t.{s} IS NULL OR t.{s} <= d.{s})").format(s=sql.Identifier(seq))
    return sql.SQL("DELETE FROM {target} t USING {stage} d WHERE {match}").format(
        target=plan.ident, stage=sql.Identifier(delete_staging_name(plan)), match=match
    )


def upsert_guarded(plan: TablePlan, seq: str | None) -> sql.Composed:
    """The plan's upsert, ignoring events older than the stored row when the target keeps the
    sequence column."""
    base = plan.upsert_from_staging()
    if not seq or seq in plan.keys or len(plan.columns) == len(plan.keys):
        return base
    return base + sql.SQL(" WHERE {target}.{s} IS NULL OR {target}.{s} <= EXCLUDED.{s}").format(
        target=plan.ident, s=sql.Identifier(seq)
    )


def _payload(table: pa.Table, oids: list[int]) -> tuple[bytes | None, Any]:
    """COPY BINARY bytes (vectorised encoder) or rows for ``write_row`` (other types)."""
    if all(o in FAST_OIDS for o in oids):
        return SIGNATURE + encode_rows(table, oids) + TRAILER, None
    from headrace_lakebase.copy_rows import python_rows

    return None, python_rows(table, oids)


def _copy(cur: psycopg.Cursor[tuple[object, ...]], stmt: sql.Composed, data: bytes | None, rows: Any,
          oids: list[int]) -> None:  # fmt: skip
    with cur.copy(stmt) as cp:
        if data is not None:
            cp.write(data)
        else:
            cp.set_types(oids)
            for row in rows:
                cp.write_row(row)


def _events(upserts: pa.Table, deletes: pa.Table, keys: list[str]) -> pa.Table:
    """The chunk's latest events as (keys..., sequence, delete flag), for the tombstone checks."""
    ups = upserts.select([*keys, SEQ]).append_column("d", pa.array([False] * upserts.num_rows, pa.bool_()))
    dels = deletes.select([*keys, SEQ]).append_column("d", pa.array([True] * deletes.num_rows, pa.bool_()))
    return pa.concat_tables([ups, dels])


def chunk_work(plan: TablePlan, spec: AutoCdcSpec, bk: Bookkeeping, batch_id: int, writer: str, chunk: Chunk,
               staged: Any, tomb: Tombstones | None = None) -> Callable[[Conn], bool]:  # fmt: skip
    """The transaction that applies one chunk of prepared events: claim the chunk in the
    bookkeeping table (False: already applied), upsert the latest non-delete event of each
    key, delete the keys whose latest event is a delete; with ``tomb``, events older than
    their key's tombstone are dropped and deletes recorded as tombstones, in the same
    transaction. ``staged`` is the sink: its ``_staged_conn`` tells on which connection the
    session's staging tables exist. Called once per chunk (again on a retry); the encoding is
    done once, here."""
    keys = list(plan.keys)
    seq = spec.sequence_by if spec.sequence_by in plan.columns else None
    upserts, deletes = split_chunk(pa.Table.from_batches(chunk.batches), keys)
    oid_of = dict(zip(plan.columns, plan.oids, strict=True))
    ev_bytes: bytes | None = None
    ev_rows: Any = None
    if tomb is not None:
        ev_oids = tomb.event_oids([oid_of[k] for k in keys])
        ev_bytes, ev_rows = _payload(_events(upserts, deletes, keys), ev_oids)
    upserts = upserts.select(list(plan.columns))
    deletes = deletes.select(keys).append_column(seq, deletes[SEQ]) if seq and seq not in keys else deletes.select(keys)
    del_cols = list(deletes.column_names)
    del_oids = [oid_of[c] for c in del_cols]
    up_bytes, up_rows = _payload(upserts, list(plan.oids)) if upserts.num_rows else (None, None)
    del_bytes, del_rows = _payload(deletes, del_oids) if deletes.num_rows and tomb is None else (None, None)

    def work(conn: Conn) -> bool:
        if staged._staged_conn is not conn:
            conn.execute(plan.create_staging())
            conn.execute(create_delete_staging(plan, seq))
            if tomb is not None:
                conn.execute(tomb.create_events())
            staged._staged_conn = conn
        with conn.transaction(), conn.cursor() as cur:
            if not bk.claim(cur, batch_id, writer, chunk.number, chunk.row_start, chunk.row_end):
                return False
            # the chunk is recorded but its events not applied: a kill here must lose both
            crash_point("lakebase_between_bookkeeping_and_data", batch_id)
            if tomb is not None:
                _copy(cur, tomb.copy_events(), ev_bytes, ev_rows, ev_oids)
                if upserts.num_rows:
                    _copy(cur, plan.copy_into(staging=True), up_bytes, up_rows, list(plan.oids))
                    cur.execute(tomb.drop_tombstoned_upserts(plan.staging_name()))
                    cur.execute(upsert_guarded(plan, seq))
                if deletes.num_rows:
                    cur.execute(tomb.delete_target(seq))
                    cur.execute(tomb.record())
                return True
            if upserts.num_rows:
                _copy(cur, plan.copy_into(staging=True), up_bytes, up_rows, list(plan.oids))
                cur.execute(upsert_guarded(plan, seq))
            if deletes.num_rows:
                stmt = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
                    sql.Identifier(delete_staging_name(plan)), sql.SQL(", ").join(map(sql.Identifier, del_cols))
                )
                _copy(cur, stmt, del_bytes, del_rows, del_oids)
                cur.execute(delete_from_staging(plan, seq))
        return True

    return work
