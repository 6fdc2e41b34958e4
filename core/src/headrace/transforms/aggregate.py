"""``AggregateOperator``: streaming ``group_by(...).agg(...)`` with Spark's output modes.

Per batch, vectorised, in two stages as Spark's partial and final ``HashAggregate``:

1. *partial*, per chunk, in the engine's reader threads (in parallel, one per partition,
   fused after the stateless steps before the aggregation: :meth:`AggregateOperator.partial`):
   event-time windows are assigned (:mod:`headrace.transforms.window`), then the chunk's
   partial aggregates per key are computed (``count``, ``sum``, ``min``, ``max``; ``avg`` as sum
   and count; variances as count, sum and sum of squares) by Arrow's hash ``group_by`` when
   every aggregate is over a bare column, by DuckDB otherwise;
2. *final*, once per batch, on the consumer thread (:meth:`AggregateOperator.finish`): the
   chunks' partials are combined per key (Arrow ``group_by``, or DuckDB for types Arrow does
   not sum exactly, e.g. decimals); (key, window) groups whose window ended at or before the
   watermark for late events (the previous batch's, as in Spark since 3.4) are dropped as
   late and counted, one per group as Spark counts them (``numRowsDroppedByWatermark``); the
   state rows
   of the keys the batch touches are fetched, merged with the partials by Arrow compute
   kernels (add, element-wise min/max) and written back;
3. output: ``update`` emits the rows changed in this batch, ``complete`` every row, ``append``
   the windows this batch's watermark has passed (evicted from state at the same time). With a
   watermark, ``update`` also evicts windows it has passed (without emitting them again).

The consumer's work per batch is proportional to the distinct keys of the batch, not to its
rows nor to the state's size. Aggregate functions: :mod:`headrace.transforms.agg_functions`; the partial
stage: :mod:`headrace.transforms.agg_partial`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import HeadraceError, UnsupportedError
from headrace.transforms.agg_functions import (
    AggSpec,
    SumOverflow,
    arrow_partials,
    final_col,
    merge_col,
    parse_aggregate,
    partial_exprs,
    quote,
)
from headrace.transforms.agg_partial import PartialAggregation, known_probe
from headrace.transforms.operator import BatchInfo
from headrace.transforms.stateful import StatefulOperator, drop_late_rows
from headrace.transforms.window import (
    SessionWindowSpec,
    WindowSpec,
    check_event_time,
    event_time_micros,
    window_struct_type,
)

__all__ = ["AggSpec", "AggregateOperator", "aggregate_operator", "parse_aggregate"]


def aggregate_operator(keys: Sequence[Any], aggs: Sequence[str], *, watermark_column: str | None = None,
                       ) -> AggregateOperator:  # fmt: skip
    """The operator of ``group_by(*keys).agg(*aggs)``: a ``SessionWindowAggregateOperator``
    when ``hr.session_window`` is among ``keys``, else an :class:`AggregateOperator`. Called
    at definition time (``GroupedFrame.agg``)."""
    if any(isinstance(k, SessionWindowSpec) for k in keys):
        from headrace.transforms.session import SessionWindowAggregateOperator

        return SessionWindowAggregateOperator(keys, aggs, watermark_column=watermark_column)
    return AggregateOperator(keys, aggs, watermark_column=watermark_column)

class AggregateOperator(StatefulOperator):
    """``group_by(*keys).agg(*aggs)``: ``keys`` are column names or ``hr.window(...)`` specs,
    ``aggs`` SQL aggregate expressions (``"count(*) AS n"``); ``watermark_column`` is the
    stream's ``with_watermark`` column (``None`` without one). Built at definition time;
    validated against the input schema by ``output_schema``."""

    operator_name: ClassVar[str] = "stateStoreSave"
    supports_real_time: ClassVar[bool] = True
    output_modes: ClassVar[tuple[str, ...] | None] = ("append", "update", "complete")
    aggregation: ClassVar[bool] = True

    def __init__(self, keys: Sequence[str | WindowSpec], aggs: Sequence[str], *, watermark_column: str | None = None) -> None:
        super().__init__()
        self.keys = list(keys)
        self.watermark_column = watermark_column
        if not aggs:
            raise HeadraceError("agg() needs at least one aggregate expression, e.g. 'count(*) AS n'")
        self.aggs = [parse_aggregate(a) for a in aggs]
        self.window: WindowSpec | None = None
        self.plain_keys: list[str] = []
        for k in self.keys:
            if isinstance(k, WindowSpec):
                if self.window is not None:
                    raise HeadraceError("group_by: at most one window per aggregation")
                self.window = k
            elif isinstance(k, str) and k:
                self.plain_keys.append(k)
            elif isinstance(k, SessionWindowSpec):
                raise HeadraceError(
                    "a session-window aggregation is a SessionWindowAggregateOperator: build it with "
                    "aggregate_operator(keys, aggs), which picks the operator for the keys"
                )
            else:
                raise HeadraceError(f"group_by key {k!r} must be a column name or hr.window(...)")
        self._buffer: list[pa.Table] = []  # the batch's partials (micro-batch mode)
        self._sql = ""
        self._arrow_plan: list[tuple[str | None, str, str]] | None = None
        self._partial_names: list[str] = []
        self._merge_kinds: list[str] = []
        self._all_add = False
        self._value_schema = pa.schema([])
        self._key_schema = pa.schema([])
        self._out_schema = pa.schema([])
        self._ts_type: pa.DataType | None = None
        self._partial_schema = pa.schema([])
        self._partials: PartialAggregation | None = None  # the partial stage, set by output_schema
        self._event_key: str | None = None  # "window" or a plain key column that is the watermark column
        self._batch_id: int | None = None  # the batch begun last (named by an overflow in the partial stage)

    # ------------------------------------------------------------------ planning
    def describe(self) -> str:
        keys = [k.describe() if isinstance(k, WindowSpec) else k for k in self.keys]
        return f"aggregate(keys=[{', '.join(keys)}], aggs=[{', '.join(a.text for a in self.aggs)}])"

    def state_spec(self) -> dict[str, Any]:
        """The aggregation's state description (``StatefulOperator.state_spec``): its grouping
        columns, its window (every parameter, exact), its aggregates as function and input
        (``count(*)``, ``sum(value)``; not their output names: renaming one keeps its state),
        the event-time column state is evicted by (the watermark's, when it is a grouping key
        or the window's column; else none) and, when there is one, the output mode (it decides
        what is evicted and when: append evicts a window as it emits it, update evicts it
        silently after updates, complete never). Without an event-time key nothing is evicted
        and update and complete keep the same state, so the mode is not recorded. The
        watermark's delay is not recorded: it moves later watermarks only, each batch's being
        kept in the checkpoint."""
        event_time = self.watermark_column if self._event_key is not None else None
        spec: dict[str, Any] = {
            "operator": "aggregate",
            "groupingKeys": list(self.plain_keys),
            "window": self.window.state_text() if self.window is not None else None,
            "aggregates": [f"{a.func}({a.arg})" for a in self.aggs],
            "eventTime": event_time,
        }
        if event_time is not None:
            spec["outputMode"] = self.output_mode
        return spec

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        """Validate keys and aggregates against ``input_schema`` (DuckDB plans the partial
        aggregation over an empty batch) and return the output schema. Called at ``start()``."""
        from headrace.transforms.expressions import ExpressionError, run_sql

        for k in self.plain_keys:
            if k not in input_schema.names:
                raise HeadraceError(f"group_by: no column {k!r} in the stream (columns: {', '.join(input_schema.names)})")
        if self.window is not None:
            self._ts_type = check_event_time(input_schema, self.window.column, f"group_by({self.window.describe()})")
            if self.window.column == self.watermark_column:
                self._event_key = "window"
        if self.watermark_column is not None and self.watermark_column in self.plain_keys:
            check_event_time(input_schema, self.watermark_column, "group_by")
            self._event_key = self.watermark_column
        key_cols = list(self.plain_keys)
        if self.window is not None:
            key_cols.append("__ws")
        if not key_cols:
            key_cols = ["__global"]
        partials: list[tuple[str, str]] = []
        for a in self.aggs:
            partials.extend(a.partials())
        select_keys = [quote(k) if k not in ("__ws", "__global") else k for k in key_cols]
        src = "batch"
        if key_cols == ["__global"]:
            select_keys = ["0::TINYINT AS __global"]
        names = [f"p{i}" for i in range(len(partials))]
        exprs = [f"{sql} AS {n}" for (sql, _), n in zip(partials, names, strict=True)]
        group = "" if key_cols == ["__global"] else " GROUP BY " + ", ".join(select_keys)
        sql = f"SELECT {', '.join(select_keys)}, count(*) AS __rows, {', '.join(exprs)} FROM {src}{group}"
        self._arrow_plan = None
        plans = [arrow_partials(a, list(input_schema.names)) for a in self.aggs]
        if all(p is not None for p in plans):
            self._arrow_plan = [x for p in plans for x in (p or [])]
            # Arrow's sum of a non-numeric (decimal, ...) column may differ in type: keep SQL then
            for col, _, fn in self._arrow_plan:
                if fn == "sum" and col is not None and not pa.types.is_integer(input_schema.field(col).type) \
                        and not pa.types.is_floating(input_schema.field(col).type):
                    self._arrow_plan = None
                    break
        self._sql = sql
        known = known_probe(input_schema, key_cols, names, self._arrow_plan)
        if known is not None:  # DuckDB's plan would give these types: no SQL planned at start()
            self._finish_schemas(input_schema, key_cols, names, partials, known)
            return self._out_schema
        empty = input_schema.empty_table()
        if self.window is not None:
            empty = empty.append_column("__ws", pa.array([], pa.int64()))
        try:
            probe = run_sql(empty, sql, what=f"aggregation {self.describe()}")
            # DuckDB sums integers as HUGEINT (decimal(38,0)); Spark's sum of integers is a long
            fixed = partial_exprs(partials, names, probe.schema, lambda exprs: run_sql(
                empty, f"SELECT {', '.join(f'({e}) AS a{i}' for i, e in enumerate(exprs))} FROM batch",
                what=f"aggregation {self.describe()}").schema.types)  # fmt: skip
            sql = f"SELECT {', '.join(select_keys)}, count(*) AS __rows, {', '.join(fixed)} FROM {src}{group}"
            probe = run_sql(empty, sql, what=f"aggregation {self.describe()}")
        except ExpressionError as e:
            raise ExpressionError(f"aggregation {', '.join(a.text for a in self.aggs)}: {e}") from None
        self._sql = sql
        self._finish_schemas(input_schema, key_cols, names, partials, probe.schema)
        return self._out_schema

    def _finish_schemas(self, input_schema: pa.Schema, key_cols: list[str], names: list[str],
                        partials: list[tuple[str, str]], probe: pa.Schema) -> None:
        """Key, value, partial and output schemas from the partial aggregation's schema."""
        self._partial_names = names
        self._merge_kinds = [k for _, k in partials]
        self._all_add = all(k == "add" for k in self._merge_kinds)
        self._key_schema = pa.schema([probe.field(k) for k in key_cols])
        self._value_schema = pa.schema([probe.field(n) for n in names])
        self._partial_schema = pa.schema([*self._key_schema, pa.field("__rows", pa.int64()), *self._value_schema])
        self._partials = PartialAggregation(
            window=self.window, key_names=list(self._key_schema.names), partial_schema=self._partial_schema,
            partial_names=names, merge_kinds=self._merge_kinds, arrow_plan=self._arrow_plan, sql=self._sql,
            what=f"aggregation {self.describe()}",
        )  # fmt: skip
        self._input_schema = input_schema
        fields: list[pa.Field] = []
        for key in self.keys:
            if isinstance(key, WindowSpec):
                assert self._ts_type is not None
                fields.append(pa.field("window", window_struct_type(self._ts_type)))
            else:
                fields.append(input_schema.field(key))
        types = self._final_types(probe)
        fields += [pa.field(a.name, t) for a, t in zip(self.aggs, types, strict=True)]
        self._out_schema = pa.schema(fields)

    def _final_types(self, probe: pa.Schema) -> list[pa.DataType]:
        out = []
        i = 0
        for a in self.aggs:
            if a.func in ("count",):
                out.append(pa.int64())
            elif a.func in ("sum", "min", "max"):
                out.append(probe.field(f"p{i}").type)
            else:
                out.append(pa.float64())
            i += len(a.partials())
        return out

    def _state_schemas(self) -> tuple[pa.Schema, pa.Schema]:
        return self._key_schema, self._value_schema

    def check_output_mode(self, mode: str) -> None:
        """Spark's rules: ``append`` needs a watermark on an event-time grouping key (a window
        emits once, when the watermark passes its end); ``update`` and ``complete`` are allowed."""
        super().check_output_mode(mode)
        if mode == "append" and self.watermark_column is None:
            raise UnsupportedError(
                "Append output mode not supported when there are streaming aggregations on streaming "
                "DataFrames/DataSets without watermark: add with_watermark(<event time column>, <delay>) and group by "
                "hr.window(<that column>, ...), or use output mode 'update' or 'complete'"
            )
        if mode == "append":
            on_key = (self.window is not None and self.window.column == self.watermark_column) or (
                self.watermark_column in self.plain_keys
            )
            if not on_key:
                raise UnsupportedError(
                    f"Append output mode not supported when there are streaming aggregations without watermark on a "
                    f"grouping key: the watermark is on {self.watermark_column!r}, which is not a grouping key nor the "
                    f"column of its window; group by hr.window({self.watermark_column!r}, ...), or use output mode "
                    "'update' or 'complete'"
                )

    # ------------------------------------------------------------------ per batch
    def begin(self, batch: BatchInfo) -> None:
        super().begin(batch)
        self._buffer = []
        self._batch_id = batch.batch_id

    def partial_stage(self) -> Callable[[pa.Table], pa.Table] | None:
        """The partial stage (``Operator.partial_stage``): :meth:`partial`, the chunk's
        partial aggregates per key. Called at ``start()``, after ``output_schema``."""
        return self.partial

    def process(self, table: pa.Table, batch: BatchInfo) -> pa.Table | None:
        """A chunk of input rows: :meth:`partial`, then :meth:`process_partial`."""
        if not table.num_rows:
            return None
        return self.process_partial(self.partial(table), batch)

    def process_partial(self, partial: pa.Table, batch: BatchInfo) -> pa.Table | None:
        """A chunk's partial aggregates (:meth:`partial`; ``Operator.process_partial``).
        Micro-batch: kept for ``finish``.
        Real-time batch in update mode: merged into state now, returning the rows it changed."""
        if not partial.num_rows:
            return None
        if batch.real_time and self.output_mode == "update":
            try:
                touched = self._merge(partial, batch)
            except SumOverflow as e:
                raise self._overflow_error(e, batch.batch_id) from None
            return self._final(*touched) if touched is not None else None
        self._buffer.append(partial)
        return None

    def finish(self, batch: BatchInfo) -> pa.Table | None:
        """Merge the batch into state, emit per output mode, evict what the watermark passed,
        then commit state version ``batch_id``."""
        mode = self.output_mode
        touched = None
        if self._buffer:
            parts, self._buffer = self._buffer, []
            try:  # (before anything of the batch is written: a restart fails the same way)
                touched = self._merge(parts[0] if len(parts) == 1 else self._combine(parts), batch)
            except SumOverflow as e:
                raise self._overflow_error(e, batch.batch_id) from None
        out: pa.Table | None = None
        wm_us = self._watermark_us(batch)
        if mode == "complete":
            rows = self.store.scan()
            out = self._final(rows.select(self._key_schema.names), rows.select(self._value_schema.names))
        elif mode == "update":
            if touched is not None:
                out = self._final(*touched)
            if wm_us is not None:
                self.store.evict(wm_us)
        elif wm_us is not None:  # append: what the watermark closed, once
            rows = self.store.evict(wm_us)
            if rows.num_rows:
                out = self._final(rows.select(self._key_schema.names), rows.select(self._value_schema.names))
        self._commit(batch)
        return out

    def needs_batch_at(self, watermark_ms: int) -> bool:
        """Only when a window (or event-time key) in state ends at or before the watermark:
        the batch would then emit it (append) or evict it (update). Complete mode evicts
        nothing (Spark runs no such batch for it)."""
        upto = self._eviction_us(watermark_ms)
        earliest = self.store.earliest_order() if upto is not None else None
        return earliest is not None and upto is not None and earliest <= upto

    def _watermark_us(self, batch: BatchInfo) -> int | None:
        return self._eviction_us(batch.watermark_ms)

    def _eviction_us(self, watermark_ms: int | None) -> int | None:
        """The order (µs) up to which state is evicted at this watermark; None: no eviction."""
        if watermark_ms is None or self._event_key is None or self.output_mode == "complete":
            return None
        return int(watermark_ms) * 1000

    # ------------------------------------------------------------------ partial stage (thread-safe)
    def partial(self, table: pa.Table) -> pa.Table:
        """One chunk's partial aggregates (:meth:`PartialAggregation.partial`). Thread-safe."""
        assert self._partials is not None, "output_schema() must be called first"
        try:
            return self._partials.partial(table)
        except SumOverflow as e:
            raise self._overflow_error(e, self._batch_id) from None

    def _overflow_error(self, e: SumOverflow, batch_id: int | None) -> HeadraceError:
        """The error for an integer sum beyond its type's range (Spark's ``ARITHMETIC_OVERFLOW``
        in its default ANSI mode), naming the aggregate, its output column and the batch."""
        from headrace.transforms.expressions import ExpressionError

        i = 0
        spec: AggSpec | None = None
        for a in self.aggs:
            n = len(a.partials())
            if e.name in (f"p{j}" for j in range(i, i + n)):
                spec = a
            i += n
        what = f"aggregate {spec.text!r} (output column {spec.name!r})" if spec else f"aggregation {self.describe()}"
        arg = spec.arg if spec else "<argument>"
        where = f" in batch {batch_id}" if batch_id is not None else ""
        if e.type_name == "bigint":
            bounds = " (a long holds -9223372036854775808 to 9223372036854775807)"
            wider = f"sum(CAST({arg} AS DECIMAL(38, 0))) or sum(CAST({arg} AS DOUBLE))"
        else:  # a decimal(38, s): only a double is wider
            bounds, wider = "", f"sum(CAST({arg} AS DOUBLE))"
        return ExpressionError(
            f"{what}: the sum of {arg} overflowed {e.type_name}{where}{bounds}; sums raise on overflow instead of "
            f"wrapping around, as in Spark's default (ANSI) mode. Sum a wider type, e.g. {wider}, with a new "
            "checkpoint (the aggregation's state changes)"
        )

    def _combine(self, parts: list[pa.Table]) -> pa.Table:
        assert self._partials is not None
        return self._partials.combine(parts, self._run_sql)

    # ------------------------------------------------------------------ final stage
    def _merge(self, partial: pa.Table, batch: BatchInfo) -> tuple[pa.Table, pa.Table] | None:
        """The batch's partials (one row per key) merged into state; returns the keys and
        their new values."""
        spec = self.window
        order: np.ndarray | None = None
        wm_us = self._eviction_us(batch.late_ms)  # late input: by the previous batch's watermark
        if self._event_key == "window":
            assert spec is not None
            order = partial.column("__ws").to_numpy() + spec.duration_us
        elif self._event_key is not None:
            order, _ = event_time_micros(partial.column(self._event_key))
        if order is not None:
            partial, order, late = drop_late_rows(partial, order, wm_us)
            if late is not None:  # counted as Spark does: late groups after partial aggregation
                self._dropped += int(late.sum())
        if not partial.num_rows:
            return None
        keys = partial.select(self._key_schema.names)
        new = partial.select(self._partial_names)
        if self._all_add:  # counts and sums: added in place by the store when it can
            new_values = new if new.schema.types == self._value_schema.types else new.cast(self._value_schema)
            added = self.store.add(keys, new_values, order)
            if added is not None:
                return keys, added
        old, found = self.store.get(keys)
        if found.any():
            cols = [merge_col(kind, o, n, f.name).cast(f.type) for kind, o, n, f in
                    zip(self._merge_kinds, old.columns, new.columns, self._value_schema, strict=True)]  # fmt: skip
            merged = pa.Table.from_arrays(cols, schema=self._value_schema)
        else:
            merged = new.cast(self._value_schema)
        self.store.put(keys, merged, order)
        return keys, merged

    def _final(self, keys: pa.Table, values: pa.Table) -> pa.Table:
        """State rows -> output rows (window struct, avg = sum / count, ...)."""
        cols: list[Any] = []
        for k in self.keys:
            if isinstance(k, WindowSpec):
                ws = keys.column("__ws").combine_chunks()
                t = window_struct_type(self._ts_type)
                start = ws.view(pa.timestamp("us")).cast(t.field("start").type)
                end = pc.add(ws, k.duration_us).view(pa.timestamp("us")).cast(t.field("end").type)
                cols.append(pa.StructArray.from_arrays([start, end], fields=list(t)))
            else:
                cols.append(keys.column(k))
        i = 0
        for a in self.aggs:
            p = [values.column(f"p{j}") for j in range(i, i + len(a.partials()))]
            i += len(p)
            cols.append(final_col(a.func, p))
        return pa.Table.from_arrays(cols, schema=self._out_schema)
