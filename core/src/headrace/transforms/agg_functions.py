"""The aggregate functions of streaming aggregations: parsing ``"sum(amount) AS total"``, the
partial aggregates each keeps in state, and the Arrow kernels that merge partials and turn
them into the final value.

Supported: ``count(*)``, ``count(expr)``, ``sum``, ``min``, ``max``, ``avg``/``mean``,
``var_samp``/``variance``, ``var_pop``, ``stddev_samp``/``stddev``, ``stddev_pop``; the argument
may be any DuckDB SQL expression over the stream's columns. ``DISTINCT`` aggregates are
refused, as in Spark's streaming. Partials: ``count`` and ``sum`` themselves, ``min``/``max``
themselves, ``avg`` as sum and count, variances as count, sum and sum of squares; merged by
addition or element-wise min/max.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import HeadraceError, UnsupportedError

__all__ = ["SUPPORTED", "AggSpec", "arrow_partials", "final_col", "merge_col", "parse_aggregate", "quote"]

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
    alias = m.group("alias")
    if alias:
        name = alias[1:-1] if alias[0] in "\"`" else alias
    else:
        name = "count(1)" if canon == "count" and arg == "*" else re.sub(r"\s+", " ", expr.strip())
    return AggSpec(canon, arg, name, expr)



def merge_col(kind: str, old: pa.ChunkedArray, new: pa.ChunkedArray) -> pa.Array:
    """Two partials of one aggregate merged row by row (``kind``: add, min or max); a null on
    one side (no value yet) gives the other side."""
    if kind == "add":
        t = old.type
        if pa.types.is_decimal(t):  # the sum of two decimal(38, s) is decimal(39, s): add wider, cast back
            wide = pa.decimal256(t.precision, t.scale)
            total = pc.add(old.cast(wide), new.cast(wide))
            return pc.coalesce(total.cast(t), old, new)
        if not old.null_count and not new.null_count:  # both sides have a value everywhere
            return pc.add(old, new)
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
