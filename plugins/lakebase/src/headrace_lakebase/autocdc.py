"""AUTO CDC in the ``lakebase`` sink: a change stream applied to a keyed PostgreSQL table.

With ``sequenceBy`` or ``applyAsDeletes`` set, each incoming record batch is prepared by
:func:`headrace.transforms.auto_cdc.prepare` (``update_preimage`` rows dropped, the output
columns of ``columnList`` / ``exceptColumnList``, the sequence and the delete flag), then cut
into chunks as usual. Each chunk is applied in one transaction, with the bookkeeping row that
makes it exactly-once: the latest event of each key wins (highest sequence); upserts go through
the staging table (``ON CONFLICT ... DO UPDATE``), deletes through a second staging table of
keys (``DELETE ... USING``). When the target keeps the sequence column, an event older than the
stored row is ignored (out-of-order events across batches).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from headrace.transforms.auto_cdc import DELETE, SEQ, AutoCdcSpec, last_per_key, prepare
from headrace_lakebase.table import TablePlan

__all__ = ["cdc_batches", "create_delete_staging", "delete_from_staging", "split_chunk", "upsert_guarded"]


def cdc_batches(data: Iterator[pa.RecordBatch], spec: AutoCdcSpec) -> Iterator[pa.RecordBatch]:
    """The input prepared for AUTO CDC, batch by batch (bounded memory)."""
    for b in data:
        if not b.num_rows:
            continue
        t = prepare(pa.Table.from_batches([b]), spec)
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
