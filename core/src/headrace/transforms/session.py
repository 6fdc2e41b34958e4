"""Session-window aggregations: ``group_by(hr.session_window("ts", "5 minutes"), *keys).agg(...)``
in micro-batch mode, with Spark's semantics (output modes ``append``, with a watermark, and
``complete``; ``update`` is refused as in Spark).

State: one row per group key whose value is the list of that key's open sessions (start,
end, partial aggregates), ordered by the earliest session end so eviction by watermark costs
the keys it closes. Per batch:

1. DuckDB splits the batch into sessions per key (``lag`` over event time: a gap longer than
   ``gap`` starts a new session; sessions that touch, ``end == start``, are one, as in Spark)
   with their partial aggregates - vectorised;
2. rows whose own session ``[ts, ts + gap)`` ended at or before the watermark for late events
   (the previous batch's, as in Spark since 3.4) are dropped as late and counted, in every
   output mode (one per distinct key and event time, as Spark's partial aggregate counts);
3. for each key the batch touches, its stored sessions and the batch's are merged where they
   overlap or touch (a late row may bridge two sessions into one) - Python per touched session, which
   is the part that is not vectorised;
4. append mode emits the sessions this batch's watermark has passed (end <= watermark) and
   removes them; complete mode emits every session (and runs no batch without data).

Progress counts sessions, as Spark's state (one row per key and session start) does:
``numRowsTotal`` is the number of sessions in state after the batch, ``numRowsUpdated`` the
sessions written for the keys the batch's input touched (every session of such a key after the
merge, including those the same batch then closes), ``numRowsRemoved`` the sessions a merge
replaced plus those the watermark closed. The total is kept by difference per batch; a run's
first batch (or a replay) counts it once over the restored state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from headrace.errors import HeadraceError, UnsupportedError
from headrace.transforms.agg_functions import (
    INT64_MAX,
    INT64_MIN,
    SumOverflow,
    final_col,
    overflow_in,
    parse_aggregate,
    partial_exprs,
    quote,
)
from headrace.transforms.aggregate import AggregateOperator
from headrace.transforms.operator import BatchInfo
from headrace.transforms.stateful import StatefulOperator, drop_late_rows
from headrace.transforms.window import (
    SessionWindowSpec,
    WindowSpec,
    check_event_time,
    event_time_micros,
    window_struct_type,
)

__all__ = ["SessionWindowAggregateOperator"]


def _merge_value(kind: str, a: Any, b: Any, name: str) -> Any:
    """Two sessions' partial ``name`` merged, as Spark's: an integer sum beyond a long raises
    :class:`SumOverflow`; NaN is above every number (a max with a NaN is NaN, a min is NaN
    only when both are)."""
    if a is None:
        return b
    if b is None:
        return a
    if kind == "add":
        total = a + b
        if isinstance(total, int) and not INT64_MIN <= total <= INT64_MAX:
            raise SumOverflow(name)
        return total
    if a != a or b != b:  # NaN (only floats are unequal to themselves)
        if kind == "max":
            return a if a != a else b
        return b if a != a else a
    return min(a, b) if kind == "min" else max(a, b)


class SessionWindowAggregateOperator(AggregateOperator):
    """``AggregateOperator`` whose keys include a ``session_window``; built by
    ``aggregate_operator(...)`` when it is given one."""

    operator_name: ClassVar[str] = "sessionWindowStateStoreSaveExec"
    supports_real_time: ClassVar[bool] = False
    output_modes: ClassVar[tuple[str, ...] | None] = ("append", "complete")

    def __init__(self, keys: Sequence[str | WindowSpec | SessionWindowSpec], aggs: Sequence[str], *,
                 watermark_column: str | None = None) -> None:  # fmt: skip
        StatefulOperator.__init__(self)
        self.keys: list[Any] = list(keys)
        self.watermark_column = watermark_column
        if not aggs:
            raise HeadraceError("agg() needs at least one aggregate expression, e.g. 'count(*) AS n'")
        self.aggs = [parse_aggregate(a) for a in aggs]
        self.window = None
        self.session: SessionWindowSpec | None = None
        self.plain_keys: list[str] = []
        for k in self.keys:
            if isinstance(k, SessionWindowSpec):
                if self.session is not None:
                    raise HeadraceError("group_by: at most one session window per aggregation")
                self.session = k
            elif isinstance(k, WindowSpec):
                raise UnsupportedError("group_by: a session window cannot be combined with another window")
            elif isinstance(k, str) and k:
                self.plain_keys.append(k)
            else:
                raise HeadraceError(f"group_by key {k!r} must be a column name, hr.window(...) or hr.session_window(...)")
        assert self.session is not None
        self._buffer: list[pa.Table] = []
        self._ts_type: pa.DataType | None = None
        self._session_type = pa.list_(pa.int64())
        # Spark's session counts: the total as of state version _sessions_version, and this
        # batch's changes (applied when the batch commits)
        self._sessions_total = 0
        self._sessions_version: int | None = None
        self._sessions_delta = 0
        self._sessions_updated = 0
        self._sessions_removed = 0

    def describe(self) -> str:
        keys = [k.describe() if isinstance(k, SessionWindowSpec) else str(k) for k in self.keys]
        return f"aggregate(keys=[{', '.join(keys)}], aggs=[{', '.join(a.text for a in self.aggs)}])"

    def state_spec(self) -> dict[str, Any]:
        """The session aggregation's state description: grouping columns, the session window
        (column and exact gap: sessions in state are ordered and closed by it), the aggregates
        as function and input, and the output mode (append closes and removes sessions as the
        watermark passes them, complete keeps every one)."""
        assert self.session is not None
        return {
            "operator": "session_window aggregate",
            "groupingKeys": list(self.plain_keys),
            "sessionWindow": self.session.state_text(),
            "aggregates": [f"{a.func}({a.arg})" for a in self.aggs],
            "outputMode": self.output_mode,
        }

    # ------------------------------------------------------------------ planning
    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        from headrace.transforms.expressions import ExpressionError, run_sql

        assert self.session is not None
        for k in self.plain_keys:
            if k not in input_schema.names:
                raise HeadraceError(f"group_by: no column {k!r} in the stream (columns: {', '.join(input_schema.names)})")
        self._ts_type = check_event_time(input_schema, self.session.column, f"group_by({self.session.describe()})")
        gap = self.session.gap_us
        part = f"PARTITION BY {', '.join(quote(k) for k in self.plain_keys)} " if self.plain_keys else ""
        partials: list[tuple[str, str]] = [p for a in self.aggs for p in a.partials()]
        names = [f"p{i}" for i in range(len(partials))]
        keys_sql = [quote(k) for k in self.plain_keys]
        group = ", ".join([*keys_sql, "__sid"])
        select_keys = ", ".join(keys_sql) + ", " if keys_sql else ""

        def build(exprs: list[str]) -> str:
            return (
                f"WITH l AS (SELECT *, CASE WHEN __t - lag(__t) OVER ({part}ORDER BY __t) <= {gap} THEN 0 ELSE 1 END "
                f"AS __new FROM batch), g AS (SELECT *, sum(__new) OVER ({part}ORDER BY __t ROWS UNBOUNDED PRECEDING) "
                f"AS __sid FROM l) SELECT {select_keys}min(__t) AS __start, max(__t) + {gap} AS __end, "
                f"count(*) AS __rows, {', '.join(exprs)} FROM g GROUP BY {group}"
            )

        empty = input_schema.empty_table().append_column("__t", pa.array([], pa.int64()))
        what = f"aggregation {self.describe()}"
        try:
            sql = build([f"{s} AS {n}" for (s, _), n in zip(partials, names, strict=True)])
            probe = run_sql(empty, sql, what=what)
            fixed = partial_exprs(partials, names, probe.schema, lambda exprs: run_sql(
                empty, f"SELECT {', '.join(f'({e}) AS a{i}' for i, e in enumerate(exprs))} FROM batch",
                what=what).schema.types)  # fmt: skip
            sql = build(fixed)
            probe = run_sql(empty, sql, what=what)
        except ExpressionError as e:
            raise ExpressionError(f"aggregation {', '.join(a.text for a in self.aggs)}: {e}") from None
        self._sql = sql
        self._partial_names = names
        self._merge_kinds = [k for _, k in partials]
        self._value_schema = pa.schema([probe.schema.field(n) for n in names])
        sess = pa.struct([pa.field("start", pa.int64()), pa.field("end", pa.int64()), *self._value_schema])
        self._session_type = pa.list_(sess)
        key_fields = [probe.schema.field(k) for k in self.plain_keys] or [pa.field("__global", pa.int8())]
        self._key_schema = pa.schema(key_fields)
        self._input_schema = input_schema
        fields: list[pa.Field] = []
        for key in self.keys:
            if isinstance(key, SessionWindowSpec):
                fields.append(pa.field("session_window", window_struct_type(self._ts_type)))
            else:
                fields.append(input_schema.field(str(key)))
        types = self._final_types(probe.schema)
        fields += [pa.field(a.name, t) for a, t in zip(self.aggs, types, strict=True)]
        self._out_schema = pa.schema(fields)
        return self._out_schema

    def _state_schemas(self) -> tuple[pa.Schema, pa.Schema]:
        return self._key_schema, pa.schema([pa.field("sessions", self._session_type)])

    def check_output_mode(self, mode: str) -> None:
        """Spark's rules: ``append`` with a watermark on the session's column, ``complete``;
        ``update`` is not supported for session windows."""
        StatefulOperator.check_output_mode(self, mode)
        assert self.session is not None
        if mode == "update":
            raise UnsupportedError(
                "Update output mode not supported for session window on streaming DataFrames/DataSets; use output "
                "mode 'append' (with a watermark) or 'complete'"
            )
        if mode == "append" and self.watermark_column != self.session.column:
            raise UnsupportedError(
                "Append output mode not supported when there are streaming aggregations on streaming "
                f"DataFrames/DataSets without watermark: add with_watermark({self.session.column!r}, <delay>) before "
                "the session-window aggregation, or use output mode 'complete'"
            )

    # ------------------------------------------------------------------ per batch
    def begin(self, batch: BatchInfo) -> None:
        """Load state version ``batch_id - 1``; count its sessions when this operator's count is
        not of that version (the run's first batch, a replay)."""
        super().begin(batch)
        self._sessions_delta = self._sessions_updated = self._sessions_removed = 0
        if self._sessions_version != batch.batch_id - 1:
            import pyarrow.compute as pc

            lengths = pc.list_value_length(self.store.scan().column("sessions"))
            self._sessions_total = int(pc.sum(lengths).as_py() or 0)
            self._sessions_version = batch.batch_id - 1

    def partial_stage(self) -> Callable[[pa.Table], pa.Table] | None:
        """None: sessions are split over the whole batch at once, on the consumer thread."""
        return None

    def process(self, table: pa.Table, batch: BatchInfo) -> pa.Table | None:
        if table.num_rows:
            self._buffer.append(table)
        return None

    def needs_batch_at(self, watermark_ms: int) -> bool:
        """Sessions close when the watermark passes their end, as the batch finds out: in
        append mode, run the batch whenever the watermark moves; complete mode closes none
        (Spark runs no such batch for it)."""
        return self.output_mode != "complete"

    def finish(self, batch: BatchInfo) -> pa.Table | None:
        mode = self.output_mode
        assert self.session is not None
        wm_us = None if batch.watermark_ms is None or mode == "complete" else int(batch.watermark_ms) * 1000
        # late input is dropped in every mode (as Spark does), by the previous batch's watermark
        late_ms = batch.late_ms if self.watermark_column == self.session.column else None
        late_us = None if late_ms is None else int(late_ms) * 1000
        emitted: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        if self._buffer:
            table = pa.concat_tables(self._buffer) if len(self._buffer) > 1 else self._buffer[0]
            self._buffer = []
            try:  # (before anything of the batch is written)
                emitted += self._merge_sessions(table, late_us, wm_us)
            except SumOverflow as e:
                raise self._overflow_error(e, batch.batch_id) from None
        out: pa.Table | None = None
        if mode == "complete":
            rows = self.store.scan()
            out = self._emit(self._explode(rows))
        else:
            if wm_us is not None:
                rows = self.store.evict(wm_us)
                if rows.num_rows:
                    emitted += self._close(rows, wm_us)
            out = self._emit(emitted) if emitted else None
        self._commit(batch)
        self._sessions_total += self._sessions_delta
        self._sessions_version = batch.batch_id
        self._metrics.update(numRowsTotal=self._sessions_total, numRowsUpdated=self._sessions_updated,
                             numRowsRemoved=self._sessions_removed)  # fmt: skip
        return out

    def _merge_sessions(self, table: pa.Table, late_us: int | None, wm_us: int | None,
                        ) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:  # fmt: skip
        """The batch's rows (those whose own session ended after ``late_us`` are kept) merged
        into their keys' sessions; returns the sessions ``wm_us`` closes (append mode)."""

        assert self.session is not None
        gap = self.session.gap_us
        ts, valid = event_time_micros(table.column(self.session.column))
        if valid is not None and not valid.all():  # a row without an event time has no session
            table, ts = table.filter(pa.array(valid)), ts[valid]
        kept, _, late = drop_late_rows(table, ts + gap, late_us)  # a row's own session: [ts, ts + gap)
        if late is not None:  # counted as Spark does: per (key, session of the row) after partial aggregation
            self._dropped += _distinct_late(table, self.plain_keys, ts, late)
            table, ts = kept, ts[~late]
        if not table.num_rows:
            return []
        from headrace.transforms.expressions import ExpressionError

        table = table.append_column("__t", pa.array(ts, pa.int64()))
        try:
            partial = self._run_sql(table, self._sql)
        except ExpressionError as e:  # an integer sum beyond a long (checked_sum_sql)
            overflow = overflow_in(e)
            if overflow is None:
                raise
            raise overflow from None
        key_names = self._key_schema.names
        if key_names == ["__global"]:
            partial = partial.append_column("__global", pa.array(np.zeros(partial.num_rows, np.int8)))
        idx = pa.array(np.arange(partial.num_rows, dtype=np.int64))
        groups = partial.select(key_names).append_column("__i", idx).group_by(key_names, use_threads=False) \
            .aggregate([("__i", "list")])  # fmt: skip
        keys = groups.select(key_names)
        members = groups.column("__i_list").to_pylist()
        new = partial.select(["__start", "__end", *self._partial_names]).to_pylist()
        old, _found = self.store.get(keys)
        old_lists = old.column("sessions").to_pylist()
        kinds = self._merge_kinds
        names = self._partial_names
        merged_lists: list[list[dict[str, Any]]] = []
        for prev, rows in zip(old_lists, members, strict=True):
            sessions = sorted([*(prev or []), *({"start": new[j]["__start"], "end": new[j]["__end"],
                                                  **{n: new[j][n] for n in names}} for j in rows)],
                              key=lambda s: s["start"])  # fmt: skip
            out: list[dict[str, Any]] = []
            for s in sessions:
                if out and s["start"] <= out[-1]["end"]:  # touching sessions merge, as in Spark
                    cur = out[-1]
                    cur["end"] = max(cur["end"], s["end"])
                    for n, kind in zip(names, kinds, strict=True):
                        cur[n] = _merge_value(kind, cur[n], s[n], n)
                else:
                    out.append(dict(s))
            merged_lists.append(out)
            # Spark writes every session of a touched key and deletes the stored ones whose start
            # no longer begins a session
            self._sessions_updated += len(out)
            starts = {s["start"] for s in out}
            self._sessions_removed += sum(1 for s in prev or [] if s["start"] not in starts)
        return self._store_sessions(keys, merged_lists, wm_us, [len(prev or []) for prev in old_lists])

    def _store_sessions(self, keys: pa.Table, lists: list[list[dict[str, Any]]], wm_us: int | None,
                        stored_before: list[int]) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        """Emit (append mode) the sessions the watermark closed; store the rest; remove keys
        left without sessions. ``stored_before``: how many sessions each key had in state."""
        emitted: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        key_rows = keys.to_pylist()
        keep_idx, keep_lists, orders, drop_idx = [], [], [], []
        for i, (kr, sessions) in enumerate(zip(key_rows, lists, strict=True)):
            open_ = sessions
            if wm_us is not None:
                closed = [s for s in sessions if s["end"] <= wm_us]
                open_ = [s for s in sessions if s["end"] > wm_us]
                emitted += [(tuple(kr.values()), s) for s in closed]
                self._sessions_removed += len(closed)
            self._sessions_delta += len(open_) - stored_before[i]
            if open_:
                keep_idx.append(i)
                keep_lists.append(open_)
                orders.append(min(s["end"] for s in open_))
            else:
                drop_idx.append(i)
        if keep_idx:
            k = keys.take(pa.array(keep_idx, pa.int64()))
            values = pa.table({"sessions": pa.array(keep_lists, type=self._session_type)})
            self.store.put(k, values, np.asarray(orders, dtype=np.int64))
        if drop_idx:
            self.store.remove(keys.take(pa.array(drop_idx, pa.int64())))
        return emitted

    def _close(self, rows: pa.Table, wm_us: int) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        keys = rows.select(self._key_schema.names)
        lists = rows.column("sessions").to_pylist()
        return self._store_sessions(keys, lists, wm_us, [len(sessions) for sessions in lists])

    def _explode(self, rows: pa.Table) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        keys = rows.select(self._key_schema.names).to_pylist()
        out = []
        for kr, sessions in zip(keys, rows.column("sessions").to_pylist(), strict=True):
            out += [(tuple(kr.values()), s) for s in sessions or []]
        return out

    def _emit(self, items: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> pa.Table:
        assert self._ts_type is not None
        wtype = window_struct_type(self._ts_type)
        starts = pa.array([s["start"] for _, s in items], pa.int64()).view(pa.timestamp("us")).cast(wtype.field(0).type)
        ends = pa.array([s["end"] for _, s in items], pa.int64()).view(pa.timestamp("us")).cast(wtype.field(1).type)
        cols: list[Any] = []
        ki = 0
        for key in self.keys:
            if isinstance(key, SessionWindowSpec):
                cols.append(pa.StructArray.from_arrays([starts, ends], fields=list(wtype)))
            else:
                f = self._key_schema.field(ki)
                cols.append(pa.array([k[ki] for k, _ in items], type=f.type))
                ki += 1
        i = 0
        for a in self.aggs:
            p = []
            for _ in a.partials():
                f = self._value_schema.field(i)
                p.append(pa.chunked_array([pa.array([s[f.name] for _, s in items], type=f.type)]))
                i += 1
            cols.append(final_col(a.func, p))
        return pa.Table.from_arrays(cols, schema=self._out_schema)



def _distinct_late(table: pa.Table, keys: Sequence[str], ts: np.ndarray, late: np.ndarray) -> int:
    """How many distinct (keys, event time) pairs the ``late`` rows of ``table`` hold: Spark's
    partial aggregate before the session window's state merges the rows of one key whose own
    sessions ``[ts, ts + gap)`` are the same, and counts what it drops after it."""
    cols = {k: table.column(k).filter(pa.array(late)) for k in keys}
    t = pa.table({**cols, "__late_ts": pa.array(ts[late], pa.int64())})
    return t.group_by(t.column_names, use_threads=False).aggregate([]).num_rows
