"""AUTO CDC into a Delta table: a batch of change events applied in one MERGE, SCD type 1 or 2.

The events were prepared by :func:`headrace.helpers.auto_cdc.prepare` when the batch was
staged (``update_preimage`` rows dropped, output columns, sequence and delete flag). The MERGE
carries the batch's app transaction ``(txnAppId, txnVersion)`` in the same commit, so a
replayed batch (transaction already in the log) changes nothing.

- SCD type 1: the latest event of each key; a delete removes the row, anything else upserts it.
  When the target keeps the ``sequenceBy`` column, an event older than the stored row is ignored;
  with ``sequenceBy``, deletes leave tombstones (:mod:`._tombstones`), so an event older than a
  key's delete arriving in a later batch is ignored as well.
- SCD type 2 (history, as Databricks): every non-delete event is a row version with
  ``__START_AT`` (its sequence) and ``__END_AT`` (the sequence of the key's next event, NULL
  while current). The batch's first event of a key closes the key's current target row
  (``__END_AT`` := that event's sequence); a delete only closes. With
  ``trackHistoryColumnList`` / ``trackHistoryExceptColumnList`` only a change to a tracked
  column opens a version; others update the current one in place (:mod:`._scd2_track`).

Memory: one batch's events (bound it with the source's rate limit, e.g. ``maxChangesPerTrigger``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import HeadraceError
from headrace.helpers.auto_cdc import DELETE, SEQ, AutoCdcSpec, last_per_key, sort_events
from headrace.helpers.crash import crash_point

__all__ = ["END_AT", "START_AT", "apply_changes", "widened_columns"]

log = logging.getLogger(__name__)

START_AT = "__START_AT"
END_AT = "__END_AT"
_ACTION = "__headrace_action"
_MK = "__headrace_mk_"


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def target_schema(prepared: pa.Schema, scd_type: int) -> pa.Schema:
    """The Delta table's schema for prepared events."""
    fields = [f for f in prepared if f.name not in (SEQ, DELETE)]
    if scd_type == 2:
        seq_type = prepared.field(SEQ).type
        fields += [pa.field(START_AT, seq_type), pa.field(END_AT, seq_type)]
    return pa.schema(fields)


def apply_changes(
    uri: str,
    events: pa.Table,
    spec: AutoCdcSpec,
    *,
    scd_type: int,
    commit_properties: Any,
    storage_options: dict[str, str] | None,
    partition_by: Sequence[str] | None,
    track_history: Sequence[str] | None = None,
    track_history_except: Sequence[str] | None = None,
    tombstones: Any = None,
    batch_id: int = 0,
    widen: bool = False,
) -> dict[str, int]:
    """MERGE ``events`` (prepared) into the table at ``uri``, creating it when missing.
    ``track_history`` / ``track_history_except``: SCD type 2 history only for changes to the
    tracked columns (:mod:`headrace_delta._scd2_track`). Returns figures for the progress
    report. ``tombstones`` (a :class:`headrace_delta._tombstones.TombstoneStore`, SCD type 1):
    events made obsolete by an earlier batch's delete are dropped, and batch ``batch_id``'s
    deletes recorded. ``widen`` (the sink's ``mergeSchema``): a column whose events have a wider
    type than the table's (:func:`widened_columns`) is widened first, else the batch fails with
    the fix. Called once per batch by the sink's commit."""
    from deltalake import DeltaTable, write_deltalake

    schema = target_schema(events.schema, scd_type)
    if not DeltaTable.is_deltatable(uri, storage_options=storage_options):
        write_deltalake(uri, schema.empty_table(), mode="append", partition_by=list(partition_by) if partition_by else None,
                        storage_options=storage_options)  # fmt: skip
    dt = DeltaTable(uri, storage_options=storage_options)
    dt = _widen(dt, uri, schema, widen=widen, partition_by=partition_by, storage_options=storage_options)
    keys = list(spec.keys)
    if spec.sequence_by is None:
        # stream order: each event's position in the batch (the staged shares in partition order)
        events = events.set_column(events.schema.get_field_index(SEQ), SEQ,
                                   pa.array(np.arange(events.num_rows, dtype=np.int64)))  # fmt: skip
    if scd_type == 1:
        latest = last_per_key(events, keys)
        if tombstones is not None:
            latest = tombstones.apply(latest, keys, batch_id)
            # batch n's tombstones are committed, its MERGE not: a replay must see the same ones
            crash_point("delta_between_tombstones_and_merge", batch_id)
            if not latest.num_rows:
                return {"num_target_rows_inserted": 0, "num_target_rows_updated": 0, "num_target_rows_deleted": 0}
        return _scd1(dt, latest, keys, schema, spec.sequence_by, commit_properties)
    if track_history is not None or track_history_except is not None:
        from headrace_delta._scd2_track import apply_tracked, tracked_columns

        data_cols = [c for c in schema.names if c not in (START_AT, END_AT)]
        tracked = tracked_columns(data_cols, keys, spec.sequence_by, track=track_history, track_except=track_history_except)
        return apply_tracked(dt, events, keys, schema, tracked, spec.sequence_by, commit_properties)
    return _scd2(dt, events, keys, schema, commit_properties)


def _wider(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether every value of Arrow type ``old`` is a value of ``new`` (and they differ)."""
    if old == new:
        return False
    if pa.types.is_signed_integer(old) and pa.types.is_signed_integer(new):
        return bool(new.bit_width > old.bit_width)
    if pa.types.is_floating(old) and pa.types.is_floating(new):
        return bool(new.bit_width > old.bit_width)
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        return bool(new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale)
    return False


def widened_columns(table: pa.Schema, events: pa.Schema) -> list[tuple[str, pa.DataType, pa.DataType]]:
    """``(column, table type, events' type)`` of the columns whose events' type widens the
    table's (a smaller integer, float or decimal type before), in the table's order."""
    by_name = {f.name: f.type for f in events}
    return [(f.name, f.type, by_name[f.name]) for f in table if f.name in by_name and _wider(f.type, by_name[f.name])]


def _widen(dt: Any, uri: str, schema: pa.Schema, *, widen: bool, partition_by: Sequence[str] | None,
           storage_options: dict[str, str] | None) -> Any:  # fmt: skip
    """The table with the columns the events widen widened: rewritten once, in one commit of its
    own (delta-rs has no type widening table feature), before the batch's MERGE; a replay finds
    them widened already. Without ``widen`` a widened column fails the batch with the fix."""
    from deltalake import DeltaTable, write_deltalake

    current = pa.schema(dt.schema().to_arrow())
    changes = widened_columns(current, schema)
    if not changes:
        return dt
    what = ", ".join(f"{name} ({old} -> {new})" for name, old, new in changes)
    if not widen:
        raise HeadraceError(
            f"AUTO CDC into Delta table {uri}: the change stream widened column(s) {what}. Fix: set mergeSchema=true "
            "so that the sink widens them (it rewrites the table once, in one commit), or rewrite the table yourself"
        )
    log.info("delta: widening column(s) %s of %s (the table is rewritten once)", what, uri)
    target = pa.schema([pa.field(f.name, dict((n, t) for n, _o, t in changes).get(f.name, f.type), f.nullable)
                        for f in current])  # fmt: skip
    data = pa.table(dt.to_pyarrow_table()).cast(target)
    write_deltalake(uri, data, mode="overwrite", schema_mode="overwrite", storage_options=storage_options,
                    partition_by=list(partition_by) if partition_by else None)  # fmt: skip
    return DeltaTable(uri, storage_options=storage_options)


def _scd1(dt: Any, latest: pa.Table, keys: list[str], schema: pa.Schema, seq_col: str | None, props: Any) -> dict[str, int]:
    match = " AND ".join(f"t.{_q(k)} = s.{_q(k)}" for k in keys)
    guard = ""
    if seq_col is not None and seq_col in schema.names and seq_col not in keys:
        guard = f" AND (t.{_q(seq_col)} IS NULL OR t.{_q(seq_col)} <= s.{_q(seq_col)})"
    cols = {c: f"s.{_q(c)}" for c in schema.names}
    others = {c: v for c, v in cols.items() if c not in keys}
    m = dt.merge(latest, predicate=match, source_alias="s", target_alias="t", commit_properties=props)
    m = m.when_matched_delete(predicate=f"s.{_q(DELETE)}{guard}")
    if others:
        m = m.when_matched_update(others, predicate=f"NOT s.{_q(DELETE)}{guard}")
    m = m.when_not_matched_insert(cols, predicate=f"NOT s.{_q(DELETE)}")
    out = m.execute()
    return {k: int(out.get(k, 0) or 0) for k in ("num_target_rows_inserted", "num_target_rows_updated", "num_target_rows_deleted")}


def _scd2(dt: Any, events: pa.Table, keys: list[str], schema: pa.Schema, props: Any) -> dict[str, int]:
    ev = sort_events(events, keys)
    n = ev.num_rows
    same_next = np.zeros(n, dtype=bool)
    if n > 1:
        same = np.ones(n - 1, dtype=bool)
        for k in keys:
            col = ev.column(k).combine_chunks()
            same &= pc.fill_null(pc.equal(col.slice(1), col.slice(0, n - 1)), False).to_numpy(zero_copy_only=False)
        same_next[:-1] = same
    first = np.ones(n, dtype=bool)
    first[1:] = ~same_next[:-1] if n > 1 else first[1:]
    seq = ev.column(SEQ).combine_chunks()
    next_seq = pa.concat_arrays([seq.slice(1), pa.nulls(1, seq.type)]) if n else seq
    end_at = pc.if_else(pa.array(same_next), next_seq, pa.nulls(n, seq.type))
    data_cols = [c for c in schema.names if c not in (START_AT, END_AT)]
    # versions: every non-delete event
    is_delete = pc.fill_null(ev.column(DELETE), False).combine_chunks()
    versions = ev.select(data_cols).append_column(START_AT, seq).append_column(END_AT, end_at).filter(pc.invert(is_delete))
    # closes: the first event of each key ends the key's current row
    closes = ev.filter(pa.array(first)).select(keys)
    closes_end = seq.filter(pa.array(first))
    null_keys = {k: pa.nulls(versions.num_rows, ev.schema.field(k).type) for k in keys}

    def frame(base: pa.Table, mk: dict[str, Any], action: str, end: Any) -> pa.Table:
        t = pa.table({c: (base.column(c) if c in base.column_names else pa.nulls(base.num_rows, schema.field(c).type))
                      for c in schema.names if c != END_AT})  # fmt: skip
        t = t.append_column(END_AT, end)
        for k in keys:
            t = t.append_column(_MK + k, mk[k])
        return t.append_column(_ACTION, pa.array([action] * base.num_rows, pa.string()))

    src = pa.concat_tables([
        frame(versions, null_keys, "insert", versions.column(END_AT)),
        frame(closes, {k: closes.column(k) for k in keys}, "close", closes_end),
    ])  # fmt: skip
    match = " AND ".join(f"t.{_q(k)} = s.{_q(_MK + k)}" for k in keys) + f" AND t.{_q(END_AT)} IS NULL"
    m = dt.merge(src, predicate=match, source_alias="s", target_alias="t", commit_properties=props)
    m = m.when_matched_update({END_AT: f"s.{_q(END_AT)}"}, predicate=f"s.{_q(_ACTION)} = 'close'")
    m = m.when_not_matched_insert({c: f"s.{_q(c)}" for c in schema.names}, predicate=f"s.{_q(_ACTION)} = 'insert'")
    out = m.execute()
    return {k: int(out.get(k, 0) or 0) for k in ("num_target_rows_inserted", "num_target_rows_updated")}
