"""SCD type 2 with ``trackHistoryColumnList`` / ``trackHistoryExceptColumnList``: history only
for changes to the tracked columns, as Databricks' ``TRACK HISTORY ON``.

Per key, events in sequence order, starting from the key's current row in the table
(``__END_AT IS NULL``, read at the snapshot the MERGE commits against):

- a non-delete event whose tracked columns equal the open version's updates that version in
  place (its other columns take the event's values; ``__START_AT`` stays);
- a non-delete event that changes a tracked column (or finds no open version) closes the open
  version (``__END_AT`` := the event's sequence) and opens a new one (``__START_AT`` := it);
- a delete closes the open version. Among events of one sequence value a non-delete beats a
  delete (as in SCD type 1: a Delta commit that rewrote a file without change data files reports
  its rows' deletes and inserts under one version), so a rewritten, unchanged row makes no version.

An event older than the current row (its ``sequenceBy`` value when the table keeps that column,
else its ``__START_AT``) is ignored, like SCD type 1. The result is one MERGE: the current row
of each touched key is updated (columns and ``__END_AT``), new versions are inserted; the MERGE
carries the batch's app transaction, so a replayed batch changes nothing.

Memory and CPU: one batch's events and the current rows of its keys, walked in Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from headrace.helpers.auto_cdc import DELETE, SEQ, AutoCdcError, sort_events
from headrace_delta._auto_cdc import _ACTION, _MK, END_AT, START_AT, _q

__all__ = ["apply_tracked", "tracked_columns"]


def tracked_columns(
    columns: Sequence[str],
    keys: Sequence[str],
    sequence_by: str | None,
    *,
    track: Sequence[str] | None,
    track_except: Sequence[str] | None,
) -> list[str]:
    """The tracked columns among the target's data ``columns`` (no ``__START_AT`` / ``__END_AT``).

    ``track`` (trackHistoryColumnList) is taken as given; ``track_except``
    (trackHistoryExceptColumnList) tracks every other column but the keys and the
    ``sequenceBy`` column (which changes with every event). Raises :class:`AutoCdcError` naming
    an unknown column and the table's columns. Called before any I/O."""
    given = track if track is not None else track_except
    name = "trackHistoryColumnList" if track is not None else "trackHistoryExceptColumnList"
    unknown = [c for c in (given or ()) if c not in columns]
    if unknown:
        raise AutoCdcError(
            f"AUTO CDC: {name} names {', '.join(repr(c) for c in unknown)}, not a column of the target table "
            f"(its columns: {', '.join(columns)}); fix {name}, or columnList / exceptColumnList"
        )
    if track is not None:
        return [c for c in columns if c in track]
    drop = {*(track_except or ()), *keys, *([sequence_by] if sequence_by else [])}
    return [c for c in columns if c not in drop]


def apply_tracked(dt: Any, events: pa.Table, keys: list[str], schema: pa.Schema, tracked: Sequence[str],
                  sequence_by: str | None, props: Any) -> dict[str, int]:  # fmt: skip
    """Apply one batch of prepared ``events`` to the SCD type 2 table ``dt`` (see the module
    docstring). Called once per batch by the sink's commit; returns figures for progress."""
    if events[SEQ].null_count:
        raise AutoCdcError(f"AUTO CDC: the sequenceBy column has NULL values in {events[SEQ].null_count} rows; "
                           "every event needs a sequence value")  # fmt: skip
    data_cols = [c for c in schema.names if c not in (START_AT, END_AT)]
    guard_col = sequence_by if sequence_by is not None and sequence_by in data_cols and sequence_by not in keys else START_AT
    ordered = sort_events(events, keys)
    ev = ordered.to_pylist()
    kt = list(zip(*(ordered[k].to_pylist() for k in keys), strict=True))  # each event's key, once
    batch_keys = set(kt)
    current = _current_rows(dt, keys, batch_keys, schema.field(keys[0]).type)
    tracked_idx = list(tracked)
    updates: list[dict[str, Any]] = []
    inserts: list[dict[str, Any]] = []
    i = 0
    while i < len(ev):
        key = kt[i]
        j = i + 1
        while j < len(ev) and kt[j] == key:
            j += 1
        target = current.get(key)
        open_row: dict[str, Any] | None = dict(target) if target is not None else None
        target_open = open_row is not None
        touched = False
        guard = target[guard_col] if target is not None else None
        for n, e in enumerate(ev[i:j], start=i):
            if guard is not None and e[SEQ] < guard:
                continue  # older than the current row: out of order across batches
            if e[DELETE]:
                k = n
                while k + 1 < j and ev[k + 1][SEQ] == e[SEQ]:
                    k += 1
                if not ev[k][DELETE]:
                    continue  # a delete and an insert of one sequence (a rewritten file): the non-delete wins
            if e[DELETE]:
                if open_row is not None:
                    open_row[END_AT] = e[SEQ]
                    touched |= target_open
                    (updates if target_open else inserts).append(open_row)
                    open_row, target_open = None, False
                continue
            if open_row is not None and all(open_row[c] == e[c] for c in tracked_idx):
                for c in data_cols:
                    open_row[c] = e[c]
                touched |= target_open
                continue
            if open_row is not None:
                open_row[END_AT] = e[SEQ]
                touched |= target_open
                (updates if target_open else inserts).append(open_row)
            open_row = {**{c: e[c] for c in data_cols}, START_AT: e[SEQ], END_AT: None}
            target_open = False
        if open_row is not None:
            if target_open:
                if touched:
                    updates.append(open_row)
            else:
                inserts.append(open_row)
        i = j
    if not updates and not inserts:
        return {"num_target_rows_inserted": 0, "num_target_rows_updated": 0}
    fields = [*schema, *(pa.field(_MK + k, schema.field(k).type) for k in keys), pa.field(_ACTION, pa.string())]
    rows = [{**r, **{_MK + k: r[k] for k in keys}, _ACTION: "update"} for r in updates]
    rows += [{**r, **{_MK + k: None for k in keys}, _ACTION: "insert"} for r in inserts]
    src = pa.Table.from_pylist(rows, schema=pa.schema(fields))
    match = " AND ".join(f"t.{_q(k)} = s.{_q(_MK + k)}" for k in keys) + f" AND t.{_q(END_AT)} IS NULL"
    m = dt.merge(src, predicate=match, source_alias="s", target_alias="t", commit_properties=props)
    upd = {c: f"s.{_q(c)}" for c in [*data_cols, END_AT] if c not in keys}
    m = m.when_matched_update(upd, predicate=f"s.{_q(_ACTION)} = 'update'")
    m = m.when_not_matched_insert({c: f"s.{_q(c)}" for c in schema.names}, predicate=f"s.{_q(_ACTION)} = 'insert'")
    out = m.execute()
    return {k: int(out.get(k, 0) or 0) for k in ("num_target_rows_inserted", "num_target_rows_updated")}


def _current_rows(dt: Any, keys: list[str], batch_keys: set[tuple[Any, ...]],
                  first_type: pa.DataType) -> dict[tuple[Any, ...], dict[str, Any]]:  # fmt: skip
    """The table's current rows (``__END_AT IS NULL``) of the batch's keys, by key."""
    import pyarrow.dataset as ds

    if not batch_keys:
        return {}
    first = pa.array(list({k[0] for k in batch_keys if k[0] is not None}), first_type)
    flt = ds.field(END_AT).is_null() & ds.field(keys[0]).isin(first)
    table = dt.to_pyarrow_dataset().to_table(filter=flt)
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in table.to_pylist():
        key = tuple(r[k] for k in keys)
        if key in batch_keys:
            if key in out:
                raise AutoCdcError(f"AUTO CDC: the SCD type 2 table has two current rows (__END_AT NULL) for key {key!r}; "
                                   "it was changed outside this sink")  # fmt: skip
            out[key] = r
    return out
