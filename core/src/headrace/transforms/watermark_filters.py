"""The filters Spark evaluates below a ``with_watermark`` step, so rows they drop do not move
the watermark.

Spark's optimizer moves a filter down through projections and through the watermark's
``EventTimeWatermark`` node when it is deterministic and does not reference the event-time
column (its ``PushPredicateThroughNonJoin`` rule); it infers ``IS NOT NULL`` filters from a
join's condition (``InferFiltersFromConstraints``) and moves a join condition's one-side
conjuncts into that side (``PushPredicateThroughJoin``), and those move down the same way. A
row such a filter drops never reaches ``EventTimeWatermark``, so its event time does not count
towards the batch's maximum, and the query's watermark can differ from one measured over every
row. ``.with_watermark("ts", "10 seconds").where("user IS NOT NULL")`` is the everyday case; a
stream-stream join on ``l.k = r.k`` is another (a row with a NULL key does not move Spark's
watermark).

headrace runs the plan as written and gives each ``with_watermark`` step the conjunction of
those filters over its own input columns (:func:`assign_measure_filters`); the step measures
event times only on the rows that pass it (``WatermarkOperator.measure_filter``). Which rows
reach the output does not change. What is followed, as Spark does: SQL steps of the shape
``SELECT <projections> FROM batch [WHERE <condition>]`` (``select_expr``, ``where``,
``with_column``, ``sql``), ``select``/``drop``/``with_column_renamed``, other watermarks (a
conjunct referencing their column stops there), and a join's inferred filters for the side(s)
its type lets Spark filter; a step of another kind (``map_batches``, a Python filter, a
stateful operator, a query with GROUP BY, DISTINCT, LIMIT or a subquery) stops the walk, and
so does a projection with a non-deterministic expression (Spark does not push through it).
Planned once when a query starts; nothing per batch unless a filter was found.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from headrace.transforms.operator import Operator

__all__ = ["Pushdown", "assign_measure_filters", "downstream_filters", "join_side_filters"]

log = logging.getLogger(__name__)

#: functions whose result changes from call to call: Spark pushes no filter through them
_NONDETERMINISTIC = {"rand", "random", "randn", "uuid", "gen_random_uuid", "shuffle", "monotonically_increasing_id",
                     "spark_partition_id", "input_file_name", "setseed"}  # fmt: skip


@dataclass
class Pushdown:
    """What a walk down a chain of steps found: the conjuncts (sqlglot expressions over the
    column names where the walk started), whether it reached the chain's end, and there each
    column's expression over the starting columns (None when a step stopped the walk)."""

    conjuncts: list[Any] = field(default_factory=list)
    end: dict[str, Any] | None = None


def _parse(sql: str) -> Any:
    import sqlglot

    try:
        return sqlglot.parse_one(sql, read="duckdb")
    except Exception:
        return None


def _split(node: Any) -> list[Any]:
    from sqlglot import exp

    if isinstance(node, exp.And):
        return _split(node.this) + _split(node.expression)
    if isinstance(node, exp.Paren):
        return _split(node.this) if isinstance(node.this, exp.And | exp.Paren) else [node.this]
    return [node]


def _pushable(node: Any) -> bool:
    """Deterministic, no aggregate, window or subquery: what Spark moves below a projection."""
    from sqlglot import exp

    for n in node.walk():
        if isinstance(n, exp.AggFunc | exp.Window | exp.Subquery | exp.Select | exp.Rand | exp.Star):
            return False
        if isinstance(n, exp.Func):
            name = (n.sql_name() if not isinstance(n, exp.Anonymous) else str(n.this)).lower()
            if name in _NONDETERMINISTIC:
                return False
    return True


def _lookup(subst: dict[str, Any], name: str) -> Any:
    if name in subst:
        return subst[name]
    hits = [k for k in subst if k.lower() == name.lower()]  # DuckDB folds unquoted names
    return subst[hits[0]] if len(hits) == 1 else None


def _substitute(node: Any, subst: dict[str, Any]) -> Any:
    """``node`` with every column replaced by its expression in ``subst``; None when a column
    is not there (an unnamed projection, a name this analysis does not know)."""
    from sqlglot import exp

    missing = False

    def swap(n: Any) -> Any:
        nonlocal missing
        if isinstance(n, exp.Column):
            if n.table and n.table != "batch":
                missing = True
                return n
            found = _lookup(subst, n.name)
            if found is None:
                missing = True
                return n
            return found.copy()
        return n

    out = node.copy().transform(swap)
    return None if missing else out


def _columns(node: Any) -> set[str]:
    from sqlglot import exp

    return {c.name for c in node.find_all(exp.Column)}


def _identity(names: Sequence[str]) -> dict[str, Any]:
    from sqlglot import exp

    return {n: exp.column(n, quoted=True) for n in names}


def _sql_step(query: str, subst: dict[str, Any], found: list[Any]) -> dict[str, Any] | None:
    """One ``SELECT ... FROM batch [WHERE ...]``: its WHERE's pushable conjuncts appended to
    ``found`` (substituted), and the columns after it; None when the walk stops here."""
    from sqlglot import exp

    tree = _parse(query)
    if not isinstance(tree, exp.Select):
        return None
    from_ = tree.args.get("from") or tree.args.get("from_")
    source = from_.this if from_ is not None else None
    if not (isinstance(source, exp.Table) and source.name == "batch" and not source.args.get("db")):
        return None
    for key in ("joins", "group", "having", "distinct", "limit", "offset", "qualify", "order", "with", "windows",
                "laterals", "pivots"):  # fmt: skip
        if tree.args.get(key):
            return None
    where = tree.args.get("where")
    if where is not None:
        for c in _split(where.this):
            if _pushable(c):
                s = _substitute(c, subst)
                if s is not None:
                    found.append(s)
    out: dict[str, Any] = {}
    for p in tree.expressions:
        if isinstance(p, exp.Star):
            excluded = {e.name for e in (p.args.get("except") or p.args.get("exclude") or [])}
            replaced = {r.alias_or_name: r.this for r in (p.args.get("replace") or [])}
            for name, e in subst.items():
                if name in excluded:
                    continue
                if name in replaced:
                    r = replaced[name]
                    if not _pushable(r):
                        return None
                    out[name] = _substitute(r, subst)
                else:
                    out[name] = e
        elif isinstance(p, exp.Alias):
            if not _pushable(p.this):
                return None
            out[p.alias] = _substitute(p.this, subst)
        elif isinstance(p, exp.Column) and not p.table:
            out[p.name] = _lookup(subst, p.name)
        elif not _pushable(p):
            return None
        # an unaliased expression: its output name is DuckDB's; it is not followed
    return {k: v for k, v in out.items() if v is not None}


def downstream_filters(steps: Sequence[tuple[Operator, pa.Schema | None]], names: Sequence[str]) -> Pushdown:
    """Walk ``steps`` (each with its input schema) from a point whose columns are ``names``:
    the conjuncts of the filters Spark would move down to that point, over those names."""
    from headrace.transforms.join import StreamStaticJoinOperator
    from headrace.transforms.stateless import (
        DropColumnsOperator,
        RenameColumnOperator,
        SelectColumnsOperator,
        SqlOperator,
    )
    from headrace.transforms.watermark import WatermarkOperator

    subst: dict[str, Any] | None = _identity(names)
    found: list[Any] = []
    barriers: set[str] = set()  # columns of the watermarks passed: a conjunct naming one stops there
    for op, schema in steps:
        assert subst is not None
        before = len(found)
        if isinstance(op, WatermarkOperator):
            e = _lookup(subst, op.column)
            barriers |= _columns(e) if e is not None else set()
        elif isinstance(op, SelectColumnsOperator):
            subst = {c: subst[c] for c in op.columns if c in subst}
        elif isinstance(op, RenameColumnOperator):
            subst = {(op.new if k == op.old else k): v for k, v in subst.items()}
        elif isinstance(op, DropColumnsOperator):
            subst = {k: v for k, v in subst.items() if k not in set(op.columns)}
        elif isinstance(op, StreamStaticJoinOperator):
            if schema is not None:
                found += [s for c in join_side_filters(op, schema) if (s := _substitute(c, subst)) is not None]
            subst = None
        elif isinstance(op, SqlOperator) and not op.stateful and schema is not None:
            try:
                query = op.base_query(schema)
            except Exception:
                query = ""
            subst = _sql_step(query, subst, found)
        else:
            subst = None
        found[before:] = [c for c in found[before:] if not (_columns(c) & barriers)]
        if subst is None:
            return Pushdown(found, None)
    return Pushdown(found, subst)


def _may_filter(op: Operator, schema: pa.Schema | None) -> bool:
    """Whether ``op`` could give a watermark before it a filter (a cheap test on the step's
    kind and query text, true when unsure), so a plan without one parses no SQL at start."""
    from headrace.transforms.join import StreamStaticJoinOperator
    from headrace.transforms.stateless import SqlOperator

    if isinstance(op, StreamStaticJoinOperator):
        return True
    if isinstance(op, SqlOperator) and not op.stateful and schema is not None:
        try:
            return "where" in op.base_query(schema).lower()
        except Exception:
            return True
    return False


def join_side_filters(op: Any, stream_schema: pa.Schema) -> list[Any]:
    """A stream-static join's filters on its stream side, over the stream's columns: the
    ``IS NOT NULL`` Spark infers for the key columns and the columns of a null-intolerant
    comparison, and the condition's conjuncts on the stream side alone, for the join types
    that let Spark filter the stream side (inner, left semi)."""
    from sqlglot import exp

    if op.how not in ("inner", "left_semi"):
        return []
    if op.keys is not None:
        return [exp.Not(this=exp.Is(this=exp.column(k, quoted=True), expression=exp.Null())) for k in op.keys]
    tree = _parse(f"SELECT 1 WHERE {op.condition}")
    if tree is None:
        return []
    names = set(stream_schema.names)
    out: list[Any] = []
    not_null: list[str] = []
    for c in _split(tree.args["where"].this):
        cols = list(c.find_all(exp.Column))
        stream = [col for col in cols if col.table == "batch" or (not col.table and col.name in names)]
        if cols and len(stream) == len(cols):
            if _pushable(c):
                out.append(_unqualified(c))
        elif isinstance(c, exp.EQ | exp.NEQ | exp.LT | exp.LTE | exp.GT | exp.GTE | exp.Between):
            not_null += [col.name for col in stream if col.name not in not_null]
    out += [exp.Not(this=exp.Is(this=exp.column(n, quoted=True), expression=exp.Null())) for n in not_null]
    return out


def _unqualified(node: Any) -> Any:
    from sqlglot import exp

    def strip(n: Any) -> Any:
        if isinstance(n, exp.Column) and n.table:
            return exp.column(n.name, quoted=True)
        return n

    return node.copy().transform(strip)


def assign_measure_filters(steps: Sequence[tuple[Operator, pa.Schema | None]],
                           tail: Sequence[Any] = ()) -> None:  # fmt: skip
    """Give each ``with_watermark`` among ``steps`` (each with its input schema) the filters
    Spark would evaluate below it. ``tail``: conjuncts over the last step's output columns
    that the consumer of this chain moves into it (a stream-stream join's side filters, the
    filters after a union). Called when a query starts, on the run's own copies of the steps."""
    from headrace.transforms.watermark import WatermarkOperator

    for i, (op, schema) in enumerate(steps):
        if not isinstance(op, WatermarkOperator) or schema is None:
            continue
        if not tail and not any(_may_filter(o, s) for o, s in steps[i + 1 :]):
            op.set_measure_filter(None)  # nothing below could filter: no SQL to parse
            continue
        walk = downstream_filters(steps[i + 1 :], schema.names)
        conjuncts = list(walk.conjuncts)
        if walk.end is not None:
            conjuncts += [s for c in tail if (s := _substitute(c, walk.end)) is not None]
        own = {op.column}
        keep = [c for c in conjuncts if not (_columns(c) & own)]
        op.set_measure_filter(" AND ".join(f"({c.sql(dialect='duckdb', identify=True)})" for c in keep) or None)
