"""The partial stage of a streaming aggregation (Spark's partial ``HashAggregate``): per chunk,
window starts assigned and one row of partial aggregates per key; then, once per batch, the
chunks' partials combined per key before they are merged into the state.

:class:`PartialAggregation` is built by ``AggregateOperator.output_schema`` at ``start()`` and
only read afterwards, so :meth:`PartialAggregation.partial` runs in the engine's reader threads
(several at once). :func:`known_probe` derives the partial aggregation's schema without
planning SQL when DuckDB's would be the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.transforms.agg_functions import (
    INT64_MAX,
    INT64_MIN,
    SumOverflow,
    has_nan,
    merge_col,
    overflow_in,
    quote,
)
from headrace.transforms.dense_group import dense_group
from headrace.transforms.window import WindowSpec, event_time_micros, event_time_range_us

__all__ = ["PartialAggregation", "known_probe"]

ArrowPlan = list[tuple[str | None, str, str]]  # (input column or None, transform, Arrow hash aggregate)
_COMBINE = {"add": "sum", "min": "min", "max": "max"}
_DENSE = {"": "sum", "double": "fsum", "square": "sqsum"}


@dataclass
class PartialAggregation:
    """How to compute and combine partial aggregates. ``key_names`` are the state's key
    columns (``__ws``: a window's start in microseconds; ``__global``: the one key of an
    aggregation without keys); the partial rows are the keys, ``__rows`` (input rows) and the
    partials ``partial_names`` (merged by ``merge_kinds``: add, min or max). ``arrow_plan``:
    the partials over bare columns without SQL, or ``None`` to run ``sql`` (DuckDB)."""

    window: WindowSpec | None
    key_names: list[str]
    partial_schema: pa.Schema
    partial_names: list[str]
    merge_kinds: list[str]
    arrow_plan: ArrowPlan | None
    sql: str
    what: str
    steps: dict[str, int] = field(init=False)
    dense_aggs: list[tuple[str | None, str]] | None = field(init=False)
    combine_arrow: list[tuple[str, str]] | None = field(init=False)
    combine_sql: str = field(init=False)

    def __post_init__(self) -> None:
        # window starts are multiples of the slide plus start_time: dense_group indexes them so
        self.steps = {"__ws": self.window.slide_us} if self.window is not None else {}
        self.dense_aggs = None
        if self.arrow_plan is not None and all(fn in ("count_all", "count", "sum") for _, _, fn in self.arrow_plan):
            self.dense_aggs = [(None, "count_all")] + [
                (col, fn if fn != "sum" else _DENSE[how]) for col, how, fn in self.arrow_plan
            ]
        kinds = ["add", *self.merge_kinds]
        names = ["__rows", *self.partial_names]
        plan: list[tuple[str, str]] | None = []
        for n, kind in zip(names, kinds, strict=True):
            t = self.partial_schema.field(n).type
            exact = pa.types.is_integer(t) or pa.types.is_floating(t)
            if kind != "add":
                exact = exact or pa.types.is_temporal(t) or pa.types.is_string(t) or pa.types.is_large_string(t) \
                    or pa.types.is_boolean(t)  # fmt: skip
            if not exact:  # e.g. decimal sums: Arrow's would wrap, DuckDB's does not
                plan = None
                break
            assert plan is not None
            plan.append((n, _COMBINE[kind]))
        self.combine_arrow = plan
        keys = [quote(k) for k in self.key_names]
        exprs = [f"{_COMBINE[k]}({quote(n)}) AS {quote(n)}" for n, k in zip(names, kinds, strict=True)]
        self.combine_sql = f"SELECT {', '.join(keys)}, {', '.join(exprs)} FROM batch GROUP BY {', '.join(keys)}"

    # ------------------------------------------------------------------ per chunk (thread-safe)
    def partial(self, table: pa.Table) -> pa.Table:
        """One chunk's partial aggregates: a row per distinct key with ``__rows`` and the
        partial columns ``p0, p1, ...``. Rows with a null event time belong to no window and
        are left out. Thread-safe."""
        if not table.num_rows:  # e.g. the engine's probe of the output schema in a batch without data
            return self.partial_schema.empty_table()
        spec = self.window
        if spec is not None:
            span = event_time_range_us(table.column(spec.column)) if self.dense_aggs is not None else None
            start = spec.single_start_between(*span) if span is not None else None
            if start is not None:  # the chunk lies in one window (chunks are short next to windows)
                out = self._dense(table, {"__ws": (start, pa.int64())})
                if out is not None:
                    return out
            ts, valid = event_time_micros(table.column(spec.column))
            if valid is not None:
                table = table.filter(pa.array(valid))
                ts = ts[valid]
            rows, starts = spec.assign(ts)
            if not spec.tumbling:
                table = table.take(pa.array(rows))
            table = table.append_column("__ws", pa.array(starts, pa.int64()))
        if self.arrow_plan is not None:
            return self._partial_arrow(table)
        from headrace.transforms.expressions import ExpressionError, run_sql

        try:
            return run_sql(table, self.sql, what=self.what).cast(self.partial_schema)
        except ExpressionError as e:  # an integer sum beyond a long (checked_sum_sql)
            overflow = overflow_in(e)
            if overflow is None:
                raise
            raise overflow from None

    def _dense(self, table: pa.Table, constants: dict[str, tuple[int, pa.DataType]]) -> pa.Table | None:
        """:func:`dense_group` of the chunk with ``constants`` as key values it has no column
        for; None when the chunk is not of the shape it handles."""
        assert self.dense_aggs is not None
        out = dense_group(table, self.key_names, self.dense_aggs, steps=self.steps, constants=constants)
        if out is None:
            return None
        return self._table(out)

    def _table(self, cols: list[Any]) -> pa.Table:
        """The partial's columns as a table of :attr:`partial_schema` (cast only where a type
        differs: a cast of a whole table costs ~0.1 ms even when nothing changes)."""
        schema = self.partial_schema
        if all(c.type == f.type for c, f in zip(cols, schema, strict=True)):
            return pa.Table.from_arrays(cols, schema=schema)
        return pa.Table.from_arrays(cols, names=schema.names).cast(schema)

    def _partial_arrow(self, table: pa.Table) -> pa.Table:
        """The partial aggregates of bare columns without SQL: by direct indexing for integer
        keys in a dense range and counts/sums without nulls (:mod:`headrace.transforms.dense_group`),
        by Arrow's hash group_by otherwise. The same columns as the SQL plan."""
        assert self.arrow_plan is not None
        key_names = self.key_names
        if "__global" in key_names:
            table = table.append_column("__global", pa.array(np.zeros(table.num_rows, np.int8)))
        if self.dense_aggs is not None:
            dense = self._dense(table, {})
            if dense is not None:
                return dense
        cols: dict[str, Any] = {k: table.column(k) for k in key_names}
        aggs: list[tuple[Any, str]] = [([], "count_all")]
        checked: dict[str, str] = {}
        for i, (col, how, fn) in enumerate(self.arrow_plan):
            if col is None:
                aggs.append(([], fn))
                continue
            c = table.column(col)
            if how == "double":  # (rounded beyond 2**53, as DuckDB's CAST(x AS DOUBLE): not refused)
                c = pc.cast(c, pa.float64(), safe=False)
            elif how == "square":
                d = pc.cast(c, pa.float64(), safe=False)
                c = pc.multiply(d, d)
            elif fn == "sum" and pa.types.is_integer(c.type):
                checked[f"__a{i}"] = self.partial_names[i]
            cols[f"__a{i}"] = c
            aggs.append((f"__a{i}", fn))
        out = group_by(pa.table(cols), key_names, aggs, checked)
        return self._table(out)

    # ------------------------------------------------------------------ per batch
    def combine(self, parts: list[pa.Table], run_sql: Callable[[pa.Table, str], pa.Table]) -> pa.Table:
        """Several chunks' partials as one row per key (keys are unique within each part, not
        across parts). Parts with the same keys in the same order (every partition saw every
        key) are merged row by row; otherwise grouped: by direct indexing or Arrow's group_by
        when they sum and compare these types exactly, by ``run_sql`` (DuckDB) otherwise."""
        keys = self.key_names
        first = parts[0].select(keys)
        if all(p.num_rows == first.num_rows and p.select(keys).equals(first) for p in parts[1:]):
            aligned: list[Any] = list(first.columns)
            for name, kind in zip(["__rows", *self.partial_names], ["add", *self.merge_kinds], strict=True):
                acc = parts[0].column(name)
                for p in parts[1:]:
                    acc = merge_col(kind, acc, p.column(name), name)
                aligned.append(acc)
            return self._table(aligned)
        table = pa.concat_tables(parts)
        if self.combine_arrow is not None:
            cols = dense_group(table, keys, self.combine_arrow, steps=self.steps)  # (its integer sums are exact)
            if cols is None:
                checked = {n: n for n, fn in self.combine_arrow
                           if fn == "sum" and pa.types.is_integer(table.schema.field(n).type)}  # fmt: skip
                cols = group_by(table, keys, self.combine_arrow, checked)
            return self._table(cols)
        return run_sql(table, self.combine_sql).cast(self.partial_schema)


def group_by(table: pa.Table, keys: list[str], aggs: list[tuple[Any, str]], checked: dict[str, str]) -> list[Any]:
    """Arrow's hash ``group_by`` of ``table``: the key columns, then one column per aggregate
    of ``aggs`` (``(column or [], function)``, at most one per column), with Spark's results
    where Arrow's differ:

    - a ``max`` over floats is NaN in a group holding a NaN (Arrow's hash max skips NaN; its
      min is NaN only when every value is, which is Spark's and DuckDB's min);
    - the integer ``sum`` of a column of ``checked`` (column -> partial name) raises
      :class:`SumOverflow` when a group's sum is beyond a long: Arrow's wraps. Rows times
      the column's largest magnitude below 2**63 cannot overflow (one ``min_max``); otherwise
      the column is summed exactly too, as decimal(38, 0), and compared with the bounds."""
    extra: list[tuple[Any, str]] = []
    nan_of: dict[str, str] = {}
    exact_of: dict[str, str] = {}
    for col, fn in aggs:
        if not isinstance(col, str):
            continue
        c = table.column(col)
        if fn == "max" and pa.types.is_floating(c.type) and has_nan(c):
            nan_of[col] = f"__nan_{col}"
            table = table.append_column(nan_of[col], pc.is_nan(c))
            extra.append((nan_of[col], "any"))
        elif fn == "sum" and col in checked and table.num_rows:
            mm = pc.min_max(c)
            bound = max(abs(mm["min"].as_py() or 0), abs(mm["max"].as_py() or 0))
            if bound * table.num_rows > INT64_MAX:
                exact_of[col] = f"__exact_{col}"
                table = table.append_column(exact_of[col], pc.cast(c, pa.decimal128(38, 0)))
                extra.append((exact_of[col], "sum"))
    g = table.group_by(keys, use_threads=False).aggregate([*aggs, *extra])
    pos = [j for j, n in enumerate(g.column_names) if n not in keys]  # the aggregates' columns, in order
    at = {name: pos[len(aggs) + j] for j, (name, _) in enumerate(extra)}
    for col, exact in exact_of.items():
        s = g.column(at[exact])
        t = s.type
        out = pc.or_(pc.less(s, pa.scalar(INT64_MIN).cast(t)), pc.greater(s, pa.scalar(INT64_MAX).cast(t)))
        if pc.any(out).as_py():
            raise SumOverflow(checked[col])
    result = [g.column(k) for k in keys]
    for j, (col, fn) in zip(pos, aggs, strict=False):
        v = g.column(j)
        if isinstance(col, str) and col in nan_of and fn == "max":
            nan = pc.fill_null(g.column(at[nan_of[col]]), False)
            v = pc.if_else(nan, pa.scalar(float("nan"), v.type), v)
        result.append(v)
    return result


def _same_in_duckdb(t: pa.DataType) -> bool:
    """Whether DuckDB returns a column of this type unchanged."""
    if pa.types.is_timestamp(t):
        return t.unit == "us" and t.tz in (None, "UTC")
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) \
        or pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_date32(t)  # fmt: skip


def known_probe(input_schema: pa.Schema, key_cols: list[str], names: list[str],
                arrow_plan: ArrowPlan | None) -> pa.Schema | None:  # fmt: skip
    """The schema DuckDB's partial aggregation would have, derived without asking it, when
    every aggregate is over a bare column (``arrow_plan``) and every type involved comes back
    from DuckDB unchanged (integers, floats, booleans, strings, binary, dates, microsecond
    timestamps without a zone or in UTC); ``None`` otherwise. (Kept equal to DuckDB's by a test
    over these types: the state's metadata records the schemas.) Called at ``start()``."""
    if arrow_plan is None:
        return None
    fields = []
    for k in key_cols:
        t = pa.int64() if k == "__ws" else pa.int8() if k == "__global" else input_schema.field(k).type
        if not _same_in_duckdb(t):
            return None
        fields.append(pa.field(k, t))
    fields.append(pa.field("__rows", pa.int64()))
    for n, (col, how, fn) in zip(names, arrow_plan, strict=True):
        src = input_schema.field(col).type if col is not None else pa.int64()
        if fn in ("count", "count_all"):
            t = pa.int64()
        elif fn in ("min", "max"):
            t = src
        elif how or pa.types.is_floating(src):  # sums of doubles
            t = pa.float64()
        else:
            t = pa.int64()  # DuckDB's HUGEINT sum of integers, cast to BIGINT as Spark's long
        if not _same_in_duckdb(src):
            return None
        fields.append(pa.field(n, t))
    return pa.schema(fields)
