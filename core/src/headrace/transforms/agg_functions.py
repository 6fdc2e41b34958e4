"""The aggregate functions of streaming aggregations: parsing ``"sum(amount) AS total"``, the
partial aggregates each keeps in state, and the Arrow kernels that merge partials and turn
them into the final value.

Supported: ``count(*)``, ``count(expr)``, ``sum``, ``min``, ``max``, ``avg``/``mean``,
``var_samp``/``variance``, ``var_pop``, ``stddev_samp``/``stddev``, ``stddev_pop``; the argument
may be any DuckDB SQL expression over the stream's columns. ``DISTINCT`` aggregates are
refused, as in Spark's streaming. Partials: ``count`` and ``sum`` themselves, ``min``/``max``
themselves, ``avg`` as sum and count, variances as count, sum and sum of squares; merged by
addition or element-wise min/max.

As in Spark (and DuckDB): ``min``/``max`` order NaN above every other number (``max`` is NaN
when any value is, ``min`` only when every non-null value is), and an integer ``sum`` beyond a
long's range is an error (Spark's default ANSI mode), not a wrapped value: every addition of
integer partials is checked and raises :class:`SumOverflow`, which the operator turns into an
``ExpressionError`` naming the aggregate and the batch.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import HeadraceError, UnsupportedError

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "SUPPORTED",
    "AggSpec",
    "SumOverflow",
    "arrow_partials",
    "checked_sum_sql",
    "final_col",
    "has_nan",
    "merge_col",
    "overflow_in",
    "parse_aggregate",
    "partial_exprs",
    "quote",
]

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
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_OVERFLOW_MARK = "headrace-sum-overflow:"


class SumOverflow(OverflowError):
    """An integer sum of partial ``name`` (``p0``, ``p1``, ...) left the range of its type
    ``type_name`` (``bigint``, or a decimal's). Raised by the merges and the partial stage;
    the aggregation operator, which knows the batch, raises an ``ExpressionError`` from it."""

    def __init__(self, name: str, type_name: str = "bigint") -> None:
        super().__init__(f"integer sum {name} overflows {type_name}")
        self.name = name
        self.type_name = type_name


def checked_sum_sql(sql: str, name: str) -> str:
    """DuckDB's ``sql`` (a ``sum(...)`` of integers: a HUGEINT) cast to BIGINT, raising an error
    that :func:`overflow_in` recognises (naming partial ``name``) when the sum is beyond a
    long's range. A NULL sum (no value) stays NULL."""
    return (f"CAST(CASE WHEN {sql} < {INT64_MIN} OR {sql} > {INT64_MAX} THEN error('{_OVERFLOW_MARK}{name}') "
            f"ELSE {sql} END AS BIGINT)")  # fmt: skip


def partial_exprs(partials: list[tuple[str, str]], names: list[str], probe: pa.Schema,
                  arg_types: Callable[[list[str]], list[pa.DataType]]) -> list[str]:  # fmt: skip
    """The partial aggregates' SELECT expressions (``<sql> AS <name>``) for DuckDB, after a
    first probe gave their types (``probe``): a ``sum`` of integers, which DuckDB computes as a
    HUGEINT (decimal(38, 0) in Arrow), becomes a long again as Spark's sum of integers, checked
    (:func:`checked_sum_sql`); a sum of decimals, of the same Arrow type, stays a decimal.
    ``arg_types`` gives the types of SQL expressions over the batch (a probe of an empty one).
    Called at ``start()``."""
    hugeint = [i for i, ((sql, _), n) in enumerate(zip(partials, names, strict=True))
               if sql.startswith("sum(") and pa.types.is_decimal(t := probe.field(n).type) and t.scale == 0]  # fmt: skip
    types = arg_types([partials[i][0][len("sum(") : -1] for i in hugeint]) if hugeint else []
    integer = {i for i, t in zip(hugeint, types, strict=True) if pa.types.is_integer(t)}
    return [f"{checked_sum_sql(sql, n)} AS {n}" if i in integer else f"{sql} AS {n}"
            for i, ((sql, _), n) in enumerate(zip(partials, names, strict=True))]  # fmt: skip


def overflow_in(error: BaseException) -> SumOverflow | None:
    """The :class:`SumOverflow` a DuckDB query of :func:`checked_sum_sql` raised (DuckDB's
    error text names the partial; the query's own text, which an error may quote, does not
    match), or None for any other error."""
    m = re.search(r"Error: " + re.escape(_OVERFLOW_MARK) + r"(\w+)", str(error))
    return SumOverflow(m.group(1)) if m else None


def has_nan(values: pa.Array | pa.ChunkedArray) -> bool:
    """Whether a floating-point column holds a NaN (one vectorised pass)."""
    return bool(pc.any(pc.is_nan(values)).as_py())


def quote(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
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


def arrow_partials(spec: AggSpec, columns: list[str]) -> list[tuple[str | None, str, str]] | None:
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
    elif _IDENT.match(arg) is None:
        from headrace.transforms.spark_sql import current_sql_dialect, to_duckdb

        if current_sql_dialect() == "spark":  # the argument is Spark SQL (no column types yet)
            arg = to_duckdb(arg, what=f"aggregate {expr!r}", kind="expression")
    alias = m.group("alias")
    if alias:
        name = alias[1:-1] if alias[0] in "\"`" else alias
    else:
        name = "count(1)" if canon == "count" and arg == "*" else re.sub(r"\s+", " ", expr.strip())
    return AggSpec(canon, arg, name, expr)



def merge_col(kind: str, old: pa.ChunkedArray, new: pa.ChunkedArray, name: str = "") -> pa.Array:
    """Two partials of one aggregate merged row by row (``kind``: add, min or max); a null on
    one side (no value yet) gives the other side. Integer (and decimal) additions are checked:
    a sum beyond the type's range raises :class:`SumOverflow` naming partial ``name``. A max
    of floats is NaN where either side is (Arrow's element-wise max skips NaN; its min is NaN
    only where both sides are, as Spark's)."""
    if kind == "add":
        t = old.type
        if pa.types.is_decimal(t):  # the sum of two decimal(38, s) is decimal(39, s): add wider, cast back
            wide = pa.decimal256(t.precision, t.scale)
            total = pc.add(old.cast(wide), new.cast(wide))
            try:
                narrow = total.cast(t)
            except pa.ArrowInvalid:
                raise SumOverflow(name, f"decimal({t.precision}, {t.scale})") from None
            return pc.coalesce(narrow, old, new)
        add = pc.add_checked if pa.types.is_integer(t) else pc.add
        try:
            total = add(old, new)
        except pa.ArrowInvalid:  # Arrow's "overflow"
            raise SumOverflow(name, "bigint" if t == pa.int64() else str(t)) from None
        if not old.null_count and not new.null_count:  # both sides have a value everywhere
            return total
        return pc.coalesce(total, old, new)
    t = old.type
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        if kind == "min":
            return pc.min_element_wise(old, new, skip_nulls=True)
        out = pc.max_element_wise(old, new, skip_nulls=True)
        if pa.types.is_floating(t) and (has_nan(old) or has_nan(new)):
            nan = pc.or_(pc.fill_null(pc.is_nan(old), False), pc.fill_null(pc.is_nan(new), False))
            out = pc.if_else(nan, pa.scalar(float("nan"), t), out)
        return out
    # timestamps, strings, decimals, ...: no element-wise min/max kernel; compare instead
    better = pc.less(new, old) if kind == "min" else pc.greater(new, old)
    pick_new = pc.or_kleene(pc.is_null(old), pc.and_kleene(pc.is_valid(new), pc.fill_null(better, False)))
    return pc.if_else(pick_new, new, old)


def final_col(func: str, p: list[pa.ChunkedArray]) -> Any:
    """The output column of aggregate ``func`` from its partials ``p``."""
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
