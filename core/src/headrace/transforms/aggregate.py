"""``AggregateOperator``: streaming ``group_by(...).agg(...)`` with Spark's output modes.

Per batch, vectorised:

1. event-time windows are assigned (:mod:`headrace.transforms.window`), then DuckDB computes
   the batch's *partial* aggregates per key (``count``, ``sum``, ``min``, ``max``; ``avg`` as
   sum and count; variances as count, sum and sum of squares);
2. (key, window) groups whose window ended at or before the watermark are dropped as late and
   counted (``numRowsDroppedByWatermark``);
3. the state rows of the keys the batch touches are fetched, merged with the partials by
   Arrow compute kernels (add, element-wise min/max) and written back;
4. output: ``update`` emits the rows changed in this batch, ``complete`` every row, ``append``
   the windows the watermark has passed (evicted from state at the same time). With a
   watermark, ``update`` also evicts windows it has passed (without emitting them again).

Supported aggregate functions: ``count(*)``, ``count(expr)``, ``sum``, ``min``, ``max``,
``avg``/``mean``, ``var_samp``/``variance``, ``var_pop``, ``stddev_samp``/``stddev``,
``stddev_pop``; the argument may be any DuckDB SQL expression over the stream's columns.
``DISTINCT`` aggregates are refused, as in Spark's streaming.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import HeadraceError, UnsupportedError
from headrace.transforms.operator import BatchInfo
from headrace.transforms.stateful import StatefulOperator
from headrace.transforms.window import (
    SessionWindowSpec,
    WindowSpec,
    check_event_time,
    event_time_micros,
    window_struct_type,
)

__all__ = ["AggregateOperator", "parse_aggregate"]

_AGG_RE = re.compile(
    r"^\s*(?P<func>[A-Za-z_][A-Za-z0-9_]*)\s*\((?P<arg>.*)\)\s*(?:AS\s+(?P<alias>[A-Za-z_][A-Za-z0-9_]*|\"[^\"]+\"|`[^`]+`))?\s*$",
    re.IGNORECASE | re.DOTALL,
)
_FUNCS = {
    "count": "count", "sum": "sum", "min": "min", "max": "max", "avg": "avg", "mean": "avg",
    "var_samp": "var_samp", "variance": "var_samp", "var_pop": "var_pop", "stddev_samp": "stddev_samp",
    "stddev": "stddev_samp", "std": "stddev_samp", "stddev_pop": "stddev_pop",
}  # fmt: skip
SUPPORTED = sorted(_FUNCS)


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class AggSpec:
    """One parsed aggregate: ``func(arg) AS name``."""

    func: str  # canonical: count, sum, min, max, avg, var_samp, var_pop, stddev_samp, stddev_pop
    arg: str  # SQL, "*" for count(*)
    name: str
    text: str

    def partials(self) -> list[tuple[str, str]]:
        """(SQL, merge kind) of the partial aggregates this aggregate keeps in state."""
        a = self.arg
        if self.func == "count":
            return [("count(*)" if a == "*" else f"count({a})", "add")]
        if self.func == "sum":
            return [(f"sum({a})", "add")]
        if self.func in ("min", "max"):
            return [(f"{self.func}({a})", self.func)]
        if self.func == "avg":
            return [(f"sum(CAST(({a}) AS DOUBLE))", "add"), (f"count({a})", "add")]
        d = f"CAST(({a}) AS DOUBLE)"
        return [(f"count({a})", "add"), (f"sum({d})", "add"), (f"sum({d} * {d})", "add")]


_IDENT = re.compile(r'^(?:[A-Za-z_][A-Za-z0-9_]*|"[^"]+")$')


def _arrow_partials(spec: AggSpec, columns: list[str]) -> list[tuple[str | None, str, str]] | None:
    """The partials of ``spec`` as (input column or None, transform, pyarrow hash aggregate),
    when its argument is a bare column (then Arrow's group_by computes them without SQL);
    ``None`` otherwise. Transforms: ``""`` (as is), ``"double"`` (cast), ``"square"``."""
    a = spec.arg
    if a == "*":
        return [(None, "", "count_all")]
    if not _IDENT.match(a):
        return None
    col = a[1:-1] if a.startswith('"') else a
    if col not in columns:
        return None
    if spec.func == "count":
        return [(col, "", "count")]
    if spec.func in ("sum", "min", "max"):
        return [(col, "", spec.func)]
    if spec.func == "avg":
        return [(col, "double", "sum"), (col, "", "count")]
    return [(col, "", "count"), (col, "double", "sum"), (col, "square", "sum")]


def parse_aggregate(expr: str) -> AggSpec:
    """Parse ``"sum(amount) AS total"``; raises naming the expression and the supported list."""
    if not isinstance(expr, str):
        raise HeadraceError(f"aggregate {expr!r} must be a SQL string such as 'count(*) AS n'")
    m = _AGG_RE.match(expr)
    fix = f"write e.g. 'count(*) AS n', 'sum(amount) AS total'; supported functions: {', '.join(SUPPORTED)}"
    if not m:
        raise HeadraceError(f"aggregate {expr!r} is not of the form func(expression) [AS name]; {fix}")
    func = m.group("func").lower()
    arg = m.group("arg").strip()
    depth = 0
    for ch in arg:
        depth += 1 if ch == "(" else -1 if ch == ")" else 0
        if depth < 0:
            raise HeadraceError(f"aggregate {expr!r} is not of the form func(expression) [AS name]; {fix}")
    if func not in _FUNCS:
        raise UnsupportedError(f"aggregate {expr!r}: {func}() is not supported in streaming aggregations; {fix}")
    if re.match(r"(?i)^distinct\b", arg):
        raise UnsupportedError(
            f"aggregate {expr!r}: distinct aggregations are not supported on streaming DataFrames/Datasets (as in "
            "Spark); use drop_duplicates(...) before the aggregation"
        )
    canon = _FUNCS[func]
    if canon == "count" and arg in ("*", "1"):
        arg = "*"
    elif not arg:
        raise HeadraceError(f"aggregate {expr!r} has no argument; {fix}")
    alias = m.group("alias")
    if alias:
        name = alias[1:-1] if alias[0] in "\"`" else alias
    else:
        name = "count(1)" if canon == "count" and arg == "*" else re.sub(r"\s+", " ", expr.strip())
    return AggSpec(canon, arg, name, expr)


class AggregateOperator(StatefulOperator):
    """``group_by(*keys).agg(*aggs)``: ``keys`` are column names or ``hr.window(...)`` specs,
    ``aggs`` SQL aggregate expressions (``"count(*) AS n"``); ``watermark_column`` is the
    stream's ``with_watermark`` column (``None`` without one). Built at definition time;
    validated against the input schema by ``output_schema``."""

    operator_name: ClassVar[str] = "stateStoreSave"
    supports_real_time: ClassVar[bool] = True
    output_modes: ClassVar[tuple[str, ...] | None] = ("append", "update", "complete")

    def __new__(cls, keys: Sequence[Any] = (), aggs: Sequence[str] = (), **kwargs: Any) -> AggregateOperator:
        """A session-window aggregation (``hr.session_window`` among ``keys``) is a
        ``SessionWindowAggregateOperator``."""
        if cls is AggregateOperator and any(isinstance(k, SessionWindowSpec) for k in keys):
            from headrace.transforms.session import SessionWindowAggregateOperator

            return super().__new__(SessionWindowAggregateOperator)
        return super().__new__(cls)

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
            else:
                raise HeadraceError(f"group_by key {k!r} must be a column name or hr.window(...)")
        self._buffer: list[pa.Table] = []
        self._sql = ""
        self._arrow_plan: list[tuple[str | None, str, str]] | None = None
        self._partial_names: list[str] = []
        self._merge_kinds: list[str] = []
        self._value_schema = pa.schema([])
        self._key_schema = pa.schema([])
        self._out_schema = pa.schema([])
        self._ts_type: pa.DataType | None = None
        self._event_key: str | None = None  # "window" or a plain key column that is the watermark column

    # ------------------------------------------------------------------ planning
    def describe(self) -> str:
        keys = [k.describe() if isinstance(k, WindowSpec) else k for k in self.keys]
        return f"aggregate(keys=[{', '.join(keys)}], aggs=[{', '.join(a.text for a in self.aggs)}])"

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
        select_keys = [_q(k) if k not in ("__ws", "__global") else k for k in key_cols]
        src = "batch"
        if key_cols == ["__global"]:
            select_keys = ["0::TINYINT AS __global"]
        names = [f"p{i}" for i in range(len(partials))]
        exprs = [f"{sql} AS {n}" for (sql, _), n in zip(partials, names, strict=True)]
        group = "" if key_cols == ["__global"] else " GROUP BY " + ", ".join(select_keys)
        sql = f"SELECT {', '.join(select_keys)}, count(*) AS __rows, {', '.join(exprs)} FROM {src}{group}"
        empty = input_schema.empty_table()
        if self.window is not None:
            empty = empty.append_column("__ws", pa.array([], pa.int64()))
        try:
            probe = run_sql(empty, sql, what=f"aggregation {self.describe()}")
            # DuckDB sums integers as HUGEINT (decimal(38,0)); Spark's sum of integers is a long
            fixed = []
            for (psql, _kind), n in zip(partials, names, strict=True):
                t = probe.schema.field(n).type
                if pa.types.is_decimal(t) and t.scale == 0 and psql.startswith("sum("):
                    fixed.append(f"CAST({psql} AS BIGINT) AS {n}")
                else:
                    fixed.append(f"{psql} AS {n}")
            sql = f"SELECT {', '.join(select_keys)}, count(*) AS __rows, {', '.join(fixed)} FROM {src}{group}"
            probe = run_sql(empty, sql, what=f"aggregation {self.describe()}")
        except ExpressionError as e:
            raise ExpressionError(f"aggregation {', '.join(a.text for a in self.aggs)}: {e}") from None
        self._sql = sql
        self._arrow_plan = None
        plans = [_arrow_partials(a, list(input_schema.names)) for a in self.aggs]
        if all(p is not None for p in plans):
            self._arrow_plan = [x for p in plans for x in (p or [])]
            # Arrow's sum of a non-numeric (decimal, ...) column may differ in type: keep SQL then
            for col, _, fn in self._arrow_plan:
                if fn == "sum" and col is not None and not pa.types.is_integer(input_schema.field(col).type) \
                        and not pa.types.is_floating(input_schema.field(col).type):
                    self._arrow_plan = None
                    break
        self._partial_names = names
        self._merge_kinds = [k for _, k in partials]
        self._key_schema = pa.schema([probe.schema.field(k) for k in key_cols])
        self._value_schema = pa.schema([probe.schema.field(n) for n in names])
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
        return self._out_schema

    def _final_types(self, probe: pa.Table) -> list[pa.DataType]:
        out = []
        i = 0
        for a in self.aggs:
            if a.func in ("count",):
                out.append(pa.int64())
            elif a.func in ("sum", "min", "max"):
                out.append(probe.schema.field(f"p{i}").type)
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

    def process(self, table: pa.Table, batch: BatchInfo) -> pa.Table | None:
        """Micro-batch: keep the chunk for ``finish``. Real-time batch in update mode: merge the
        chunk into state now and emit the rows it changed."""
        if not table.num_rows:
            return None
        if batch.real_time and self.output_mode == "update":
            touched = self._merge(table, batch)
            return self._final(*touched) if touched is not None else None
        self._buffer.append(table)
        return None

    def finish(self, batch: BatchInfo) -> pa.Table | None:
        """Merge the batch into state, emit per output mode, evict what the watermark passed,
        then commit state version ``batch_id``."""
        mode = self.output_mode
        touched = None
        if self._buffer:
            table = pa.concat_tables(self._buffer) if len(self._buffer) > 1 else self._buffer[0]
            self._buffer = []
            touched = self._merge(table, batch)
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

    def _watermark_us(self, batch: BatchInfo) -> int | None:
        if batch.watermark_ms is None or self._event_key is None or self.output_mode == "complete":
            return None
        return int(batch.watermark_ms) * 1000

    def _merge(self, table: pa.Table, batch: BatchInfo) -> tuple[pa.Table, pa.Table] | None:

        spec = self.window
        order: np.ndarray | None = None
        if spec is not None:
            ts, valid = event_time_micros(table.column(spec.column))
            if valid is not None:
                table = table.filter(pa.array(valid))
                ts = ts[valid]
            rows, starts = spec.assign(ts)
            if not spec.tumbling:
                table = table.take(pa.array(rows))
            table = table.append_column("__ws", pa.array(starts, pa.int64()))
        if self._arrow_plan is not None:
            partial = self._partial_arrow(table)
        else:
            partial = self._run_sql(table, self._sql)
        wm_us = self._watermark_us(batch)
        if self._event_key == "window":
            assert spec is not None
            order = partial.column("__ws").to_numpy() + spec.duration_us
        elif self._event_key is not None:
            order, _ = event_time_micros(partial.column(self._event_key))
        if wm_us is not None and order is not None:
            late = order <= wm_us
            if late.any():
                self._dropped += int(partial.column("__rows").to_numpy()[late].sum())
                keep = pa.array(~late)
                partial = partial.filter(keep)
                order = order[~late]
        if not partial.num_rows:
            return None
        keys = partial.select(self._key_schema.names)
        new = partial.select(self._partial_names)
        old, found = self.store.get(keys)
        if found.any():
            cols = [_merge_col(kind, o, n).cast(f.type) for kind, o, n, f in
                    zip(self._merge_kinds, old.columns, new.columns, self._value_schema, strict=True)]  # fmt: skip
            merged = pa.Table.from_arrays(cols, schema=self._value_schema)
        else:
            merged = new.cast(self._value_schema)
        self.store.put(keys, merged, order)
        return keys, merged

    def _partial_arrow(self, table: pa.Table) -> pa.Table:
        """The partial aggregates by Arrow's hash group_by (aggregates over bare columns): the
        same columns as the SQL plan, without parsing and planning SQL per batch."""
        assert self._arrow_plan is not None
        key_names = self._key_schema.names
        cols: dict[str, Any] = {}
        for k in key_names:
            cols[k] = pa.array(np.zeros(table.num_rows, np.int8)) if k == "__global" else table.column(k)
        aggs: list[tuple[Any, str]] = [([], "count_all")]
        for i, (col, how, fn) in enumerate(self._arrow_plan):
            if col is None:
                aggs.append(([], fn))
                continue
            c = table.column(col)
            if how == "double":
                c = pc.cast(c, pa.float64())
            elif how == "square":
                d = pc.cast(c, pa.float64())
                c = pc.multiply(d, d)
            cols[f"__a{i}"] = c
            aggs.append((f"__a{i}", fn))
        g = pa.table(cols).group_by(key_names, use_threads=False).aggregate(aggs)
        agg_cols = [g.column(j) for j, n in enumerate(g.column_names) if n not in key_names]
        out = [g.column(k) for k in key_names] + agg_cols
        names = [*key_names, "__rows", *self._partial_names]
        result = pa.Table.from_arrays(out, names=names)
        schema = pa.schema([*self._key_schema, pa.field("__rows", pa.int64()), *self._value_schema])
        return result.cast(schema)

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
            cols.append(_final_col(a.func, p))
        return pa.Table.from_arrays(cols, schema=self._out_schema)


def _merge_col(kind: str, old: pa.ChunkedArray, new: pa.ChunkedArray) -> pa.Array:
    if kind == "add":
        t = old.type
        if pa.types.is_decimal(t):  # the sum of two decimal(38, s) is decimal(39, s): add wider, cast back
            wide = pa.decimal256(t.precision, t.scale)
            total = pc.add(old.cast(wide), new.cast(wide))
            return pc.coalesce(total.cast(t), old, new)
        return pc.coalesce(pc.add(old, new), old, new)
    t = old.type
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        if kind == "min":
            return pc.min_element_wise(old, new, skip_nulls=True)
        return pc.max_element_wise(old, new, skip_nulls=True)
    # timestamps, strings, decimals, ...: no element-wise min/max kernel; compare instead
    better = pc.less(new, old) if kind == "min" else pc.greater(new, old)
    pick_new = pc.or_kleene(pc.is_null(old), pc.and_kleene(pc.is_valid(new), pc.fill_null(better, False)))
    return pc.if_else(pick_new, new, old)


def _final_col(func: str, p: list[pa.ChunkedArray]) -> Any:
    if func == "count":
        return pc.coalesce(p[0], 0)
    if func in ("sum", "min", "max"):
        return p[0]
    if func == "avg":
        s, n = p
        return pc.if_else(pc.greater(n, 0), pc.divide(s, pc.cast(n, pa.float64())), pa.scalar(None, pa.float64()))
    n = pc.cast(p[0], pa.float64())
    s, ss = p[1], p[2]
    mean = pc.divide(s, n)
    m2 = pc.subtract(ss, pc.multiply(s, mean))  # sum of squared deviations
    m2 = pc.max_element_wise(m2, 0.0)
    if func in ("var_pop", "stddev_pop"):
        var = pc.if_else(pc.greater(n, 0), pc.divide(m2, n), pa.scalar(None, pa.float64()))
    else:
        var = pc.if_else(pc.greater(n, 1), pc.divide(m2, pc.subtract(n, 1.0)), pa.scalar(None, pa.float64()))
    return pc.sqrt(var) if func.startswith("stddev") else var
