"""Stream-stream joins: Spark's symmetric hash join, micro-batch.

``left.join(right, on=..., how=...)`` with two streams makes one operator that reads both: the
query's sources are the left frame's then the right frame's, and each side's own steps (its
projections, filters and ``with_watermark``) run in the reader threads on its own sources'
record batches (:meth:`StreamStreamJoinOperator.side_transform`), which tag each table with
its side. On the consumer, per batch (Spark's order):

1. late rows dropped per side: a row whose event time (the side's watermark column) is at or
   before the watermark for late events (``numRowsDroppedByWatermark``);
2. the left rows joined with the right side's state, then kept in the left side's state
   (unless a left-semi row already matched);
3. the right rows joined with the left side's state (which now holds this batch's left rows),
   then kept in the right side's state (unless the state watermark evicts them at the end of
   this batch and they need no unmatched output); a left semi join runs 3 before 2, as Spark
   does, so a left row matching a right row of its own batch is emitted and never kept, and
   a stored left row a right row matches is emitted and removed (it can never be emitted
   again);
4. both sides' state evicted by the watermark for eviction: by the join key when a key is a
   side's event-time column, else by the side's event time against the bound the join
   condition puts on it (``l.ts BETWEEN r.ts - INTERVAL 1 HOUR AND r.ts`` keeps a left row
   until the watermark passes ``l.ts + 1 hour``, a right row until it passes ``r.ts``); an
   evicted row of the preserved side of an outer join that never matched is emitted with
   NULLs for the other side.

State per side, in the query's state store (memory or RocksDB, versioned per batch, restored on
a replay), under ``state/<step>/<side>-keys`` (join key -> the sequence numbers of its rows)
and ``state/<step>/<side>-rows`` (join key and sequence number -> the row and whether it
matched, ordered by the time it is evicted at). A batch reads the rows of the keys it brings,
writes its own rows and removes what it evicts: its cost grows with the batch and the rows
evicted, not with the state's size.

Refused as Spark refuses them (checked when the frame is defined, before any I/O): a join
without an equality between the sides, outer and semi joins whose preserved side's state
could never be evicted, any output mode but append, the real-time trigger.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import CheckpointError, HeadraceError, UnsupportedError
from headrace.transforms.expressions import ExpressionError, condition_mask, quote_ident
from headrace.transforms.multi_input import TwoInputs, side_of
from headrace.transforms.operator import BatchInfo, Operator, OperatorContext, StateWrite
from headrace.transforms.stateful import StatefulOperator
from headrace.transforms.watermark import WatermarkOperator

__all__ = ["JOIN_TYPES", "StreamStreamJoinOperator", "join_type"]

log = logging.getLogger(__name__)

#: ``how`` spellings (PySpark's) -> the join type
JOIN_TYPES = {
    "inner": "inner",
    "left": "left_outer", "leftouter": "left_outer", "left_outer": "left_outer",
    "right": "right_outer", "rightouter": "right_outer", "right_outer": "right_outer",
    "full": "full_outer", "outer": "full_outer", "fullouter": "full_outer", "full_outer": "full_outer",
    "semi": "left_semi", "leftsemi": "left_semi", "left_semi": "left_semi",
}  # fmt: skip
_SPARK_NAME = {"inner": "Inner", "left_outer": "LeftOuter", "right_outer": "RightOuter",
               "full_outer": "FullOuter", "left_semi": "LeftSemi"}  # fmt: skip

#: the sides Spark filters before the join (by the condition's inferred IS NOT NULL and its
#: one-side conjuncts), per join type: not the preserved side of an outer join
_FILTERED_SIDES = {"inner": (0, 1), "left_semi": (0, 1), "left_outer": (1,), "right_outer": (0,)}
_SEQ = "__index"
_MATCHED = "__matched"
_ROW = "__i"
_NO_ORDER = None


def join_type(how: str) -> str:
    """PySpark's ``how`` of a stream-stream join as one of ``inner``, ``left_outer``,
    ``right_outer``, ``full_outer``, ``left_semi``; raises naming the ones it takes."""
    key = str(how).lower().replace("-", "_")
    if key in JOIN_TYPES:
        return JOIN_TYPES[key]
    if key in ("anti", "leftanti", "left_anti", "cross"):
        raise UnsupportedError(
            f"join(how={how!r}) of two streams is not supported (as in Spark: {key.replace('_', '').title()} joins "
            "between two streaming DataFrames/Datasets are not supported); use inner, left, right, full or left_semi"
        )
    raise HeadraceError(f"join(how={how!r}): not a join type; use one of inner, left, right, full, left_semi")


# ------------------------------------------------------------------------------------------ condition


@dataclass
class _Linear:
    """``sum(coef * column) + const_us`` over (side, column) terms: a time expression."""

    terms: dict[tuple[int, str], int] = field(default_factory=dict)
    const_us: int = 0

    def plus(self, other: _Linear, sign: int = 1) -> _Linear:
        terms = dict(self.terms)
        for k, v in other.terms.items():
            terms[k] = terms.get(k, 0) + sign * v
        return _Linear({k: v for k, v in terms.items() if v}, self.const_us + sign * other.const_us)


@dataclass(frozen=True)
class _Bound:
    """A conjunct ``state_side.col > other_side.col + const_us`` (``strict``) or ``>=``."""

    side: int  # the side whose rows it bounds from below
    column: str
    other_column: str
    const_us: int
    strict: bool


@dataclass
class JoinCondition:
    """What the planner takes from a join's ``on``: equality key pairs (left column, right
    column), the DuckDB text of the rest of the condition over ``l``/``r`` (None: nothing
    more), and the time bounds it puts on each side."""

    keys: list[tuple[str, str]]
    residual: str | None
    bounds: list[_Bound]
    using: bool
    #: per side, the columns a NULL in which fails the condition (the keys and the columns of
    #: its comparisons): Spark infers ``IS NOT NULL`` filters on them before the join
    not_null: tuple[list[str], list[str]] = ([], [])
    #: per side, the condition's conjuncts over that side's columns alone (DuckDB SQL over its
    #: unqualified columns): Spark moves them into the side for the join types that allow it
    one_side: tuple[list[str], list[str]] = ([], [])


def _interval_us(node: Any, what: str) -> int:
    from sqlglot import exp

    unit = str(node.args.get("unit").name if node.args.get("unit") is not None else "").lower()
    text = node.this.name if isinstance(node.this, exp.Literal) else node.this.sql()
    parts = str(text).split()
    if len(parts) == 2 and not unit:
        text, unit = parts[0], parts[1].lower()
    try:
        n = float(text)
    except ValueError:
        raise ExpressionError(f"{what}: cannot read the interval {node.sql()!r}") from None
    unit = unit.rstrip("s")
    scale = {"microsecond": 1, "millisecond": 1000, "second": 1_000_000, "minute": 60_000_000, "hour": 3_600_000_000,
             "day": 86_400_000_000, "week": 7 * 86_400_000_000}.get(unit)  # fmt: skip
    if scale is None:
        raise ExpressionError(f"{what}: interval unit {unit!r} cannot bound a join (use seconds to weeks)")
    return round(n * scale)


def _linear(node: Any, side_of: Callable[[Any], tuple[int, str] | None], what: str) -> _Linear | None:
    """``node`` as a linear time expression, or None when it is something else."""
    from sqlglot import exp

    if isinstance(node, exp.Paren):
        return _linear(node.this, side_of, what)
    if isinstance(node, exp.Column):
        ref = side_of(node)
        return _Linear({ref: 1}) if ref is not None else None
    if isinstance(node, exp.Interval):
        return _Linear({}, _interval_us(node, what))
    if isinstance(node, exp.Add | exp.Sub):
        a, b = _linear(node.this, side_of, what), _linear(node.expression, side_of, what)
        if a is None or b is None:
            return None
        return a.plus(b, 1 if isinstance(node, exp.Add) else -1)
    return None


def _bound_of(lower: Any, upper: Any, strict: bool, side_of: Callable[[Any], tuple[int, str] | None],
              event: tuple[str | None, str | None], what: str) -> list[_Bound]:  # fmt: skip
    """The bounds of ``lower < upper`` (or ``<=``): ``upper - lower > 0`` as ``state > other + c``."""
    lo, hi = _linear(lower, side_of, what), _linear(upper, side_of, what)
    if lo is None or hi is None:
        return []
    d = hi.plus(lo, -1)  # d > 0 (strict) / d >= 0
    if len(d.terms) != 2:
        return []
    out = []
    for (side, col), coef in d.terms.items():
        others = [(s, c, k) for (s, c), k in d.terms.items() if s != side]
        if coef != 1 or not others or others[0][2] != -1:
            continue
        # col - other + c (>|>=) 0  ->  col (>|>=) other - c
        other_col = others[0][1]
        if event[1 - side] != other_col:
            continue  # Spark bounds a side by the other side's watermarked event time
        out.append(_Bound(side, col, other_col, -d.const_us, strict))
    return out


def parse_condition(on: Any, left: pa.Schema, right: pa.Schema, aliases: tuple[str | None, str | None],
                    event: tuple[str | None, str | None], dialect: str) -> JoinCondition:  # fmt: skip
    """``on`` (column names, or a SQL condition over the sides' columns, qualified by the
    frames' aliases or unqualified when only one side has the name) as a :class:`JoinCondition`."""
    what = f"join(on={on!r})"
    if not isinstance(on, str) or on.strip().isidentifier():
        names = [on] if isinstance(on, str) else list(on)
        if not names:
            raise HeadraceError("join(on=...) needs at least one key column (or a SQL condition)")
        for n in names:
            if n not in left.names or n not in right.names:
                raise ExpressionError(
                    f"{what}: USING column {n!r} must be on both sides (left has {left.names}, right has {right.names})"
                )
        return JoinCondition([(n, n) for n in names], None, [], True, (list(names), list(names)))
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(on, read="spark" if dialect == "spark" else "duckdb")
    except Exception as e:
        raise ExpressionError(f"{what}: not a SQL condition: {str(e).splitlines()[0]}") from None
    side_names = (set(left.names), set(right.names))

    def side_of(col: Any) -> tuple[int, str] | None:
        name, table = col.name, col.table
        if table:
            for s in (0, 1):
                if aliases[s] is not None and table == aliases[s]:
                    if name not in side_names[s]:
                        raise ExpressionError(f"{what}: {table}.{name}: the {('left', 'right')[s]} side has no "
                                              f"column {name!r} (it has {sorted(side_names[s])})")  # fmt: skip
                    return (s, name)
            raise ExpressionError(f"{what}: {table!r} names neither side; the sides' aliases are "
                                  f"{[a for a in aliases if a]} (set them with frame.alias('l'))")  # fmt: skip
        hits = [s for s in (0, 1) if name in side_names[s]]
        if len(hits) != 1:
            raise ExpressionError(
                f"{what}: column {name!r} is "
                + (
                    "on both sides; qualify it (frame.alias('l'), then l." + name + ")"
                    if hits
                    else "on neither side"
                )
            )
        return (hits[0], name)

    conjuncts: list[Any] = []

    def split(node: Any) -> None:
        if isinstance(node, exp.And):
            split(node.this)
            split(node.expression)
        elif isinstance(node, exp.Paren) and isinstance(node.this, exp.And):
            split(node.this)
        else:
            conjuncts.append(node)

    split(tree)
    keys: list[tuple[str, str]] = []
    rest: list[Any] = []
    bounds: list[_Bound] = []
    not_null: tuple[list[str], list[str]] = ([], [])
    one_side: tuple[list[str], list[str]] = ([], [])
    for c in conjuncts:
        refs = [side_of(col) for col in c.find_all(exp.Column)]  # every column resolves
        sides = {ref[0] for ref in refs if ref is not None}
        if len(sides) == 1:
            one_side[sides.pop()].append(_side_sql(c, side_of, dialect, what))
        if isinstance(c, exp.EQ | exp.LT | exp.LTE | exp.GT | exp.GTE | exp.Between) and all(
            _linear(x, side_of, what) is not None for x in c.iter_expressions()
        ):  # null-intolerant: a NULL in any of its columns makes it NULL
            for ref in refs:
                if ref is not None and ref[1] not in not_null[ref[0]]:
                    not_null[ref[0]].append(ref[1])
        if isinstance(c, exp.EQ) and isinstance(c.this, exp.Column) and isinstance(c.expression, exp.Column):
            a, b = side_of(c.this), side_of(c.expression)
            if a is not None and b is not None and a[0] != b[0]:
                lcol, rcol = (a[1], b[1]) if a[0] == 0 else (b[1], a[1])
                keys.append((lcol, rcol))
                continue
        rest.append(c)
        if isinstance(c, exp.Between):
            bounds += _bound_of(c.args["low"], c.this, False, side_of, event, what)
            bounds += _bound_of(c.this, c.args["high"], False, side_of, event, what)
        elif isinstance(c, exp.LT | exp.LTE):
            bounds += _bound_of(c.this, c.expression, isinstance(c, exp.LT), side_of, event, what)
        elif isinstance(c, exp.GT | exp.GTE):
            bounds += _bound_of(c.expression, c.this, isinstance(c, exp.GT), side_of, event, what)
    residual = None
    if rest:
        body = exp.and_(*[r.copy() for r in rest])
        for col in body.find_all(exp.Column):
            ref = side_of(col)
            assert ref is not None
            col.set("table", exp.to_identifier("r" if ref[0] else "l"))
            col.set("this", exp.to_identifier(ref[1], quoted=True))
        if dialect == "spark":
            from headrace.transforms.spark_sql import to_duckdb

            residual = to_duckdb(body.sql(dialect="spark"), what=what, kind="expression")
        else:
            residual = body.sql(dialect="duckdb")
    return JoinCondition(keys, residual, bounds, False, not_null, one_side)


def _side_sql(node: Any, side_of: Callable[[Any], tuple[int, str] | None], dialect: str, what: str) -> str:
    """A conjunct over one side's columns as DuckDB SQL over its unqualified, quoted columns."""
    from sqlglot import exp

    body = node.copy()
    for col in list(body.find_all(exp.Column)):
        ref = side_of(col)
        assert ref is not None
        col.replace(exp.column(ref[1], quoted=True))
    if dialect == "spark":
        from headrace.transforms.spark_sql import to_duckdb

        return to_duckdb(body.sql(dialect="spark"), what=what, kind="expression")
    return str(body.sql(dialect="duckdb"))


# ------------------------------------------------------------------------------------------ state


def _time_us(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A timestamp column as int64 epoch microseconds (nulls kept)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if col.type.unit != "us":
        col = pc.cast(col, pa.timestamp("us", tz=col.type.tz), safe=False)
    return col.view(pa.int64())


def _flat_keys(table: pa.Table, columns: Sequence[str]) -> list[pa.Array]:
    """The join key columns as flat arrays (a struct key, e.g. a window, as its fields)."""
    out: list[pa.Array] = []
    for c in columns:
        arr = table.column(c).combine_chunks()
        if pa.types.is_struct(arr.type):
            out += [arr.field(i) for i in range(arr.type.num_fields)]
        else:
            out.append(arr)
    return out


class _SideState:
    """One side's rows in two stores, as Spark's ``SymmetricHashJoinStateManager``: ``keys``
    (join key -> how many rows it has, ``__n``) and ``rows`` ((join key, index 0..n-1) -> the
    row and whether it matched, ordered by its eviction time). Every operation is vectorised
    over the batch's keys and rows; a removal moves the key's last rows into the holes it
    leaves, so a key's rows stay numbered 0..n-1."""

    def __init__(self, keys: Any, rows: Any, n_key: int, order_of: Callable[[pa.Table], pa.Array]) -> None:
        self.keys = keys
        self.rows = rows
        self.n_key = n_key
        self.key_names = [f"__k{i}" for i in range(n_key)]
        self.order_of = order_of  # a stored row's eviction time, from its values

    def _counts(self, kt: pa.Table) -> np.ndarray:
        counts, found = self.keys.get(kt)
        n = np.asarray(counts.column(0).fill_null(0).to_numpy(zero_copy_only=False), np.int64)
        return np.where(np.asarray(found, bool), n, 0)

    @staticmethod
    def _expand(n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For counts ``n`` per group: each item's group and its index 0..n-1 within it."""
        group = np.repeat(np.arange(len(n), dtype=np.int64), n)
        starts = np.repeat(np.cumsum(n) - n, n)
        return group, np.arange(int(n.sum()), dtype=np.int64) - starts

    def _distinct(self, table: pa.Table) -> tuple[pa.Table, np.ndarray]:
        """The distinct keys of ``table``'s key columns, and each row's position among them."""
        if self.n_key == 1:  # one integer or temporal key without NULLs: numpy's hash unique
            col = table.column(self.key_names[0])
            t = col.type
            if (
                not col.null_count
                and (pa.types.is_integer(t) or pa.types.is_temporal(t))
                and t.bit_width == 64
            ):
                arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
                ints = np.asarray(arr.view(pa.int64()).to_numpy(zero_copy_only=False))
                uniq, inverse = np.unique(ints, return_inverse=True)
                keys_arr = pa.array(uniq, pa.int64())
                return pa.table(
                    {self.key_names[0]: keys_arr.view(t) if t != pa.int64() else keys_arr}
                ), inverse.astype(np.int64, copy=False)
        keys = table.select(self.key_names).append_column(
            "__r", pa.array(np.arange(table.num_rows, dtype=np.int64))
        )
        grouped = keys.group_by(self.key_names, use_threads=False).aggregate([("__r", "list")])
        lists = grouped.column("__r_list").combine_chunks()
        rows = np.asarray(pc.list_flatten(lists).to_numpy(zero_copy_only=False), np.int64)
        parent = np.asarray(pc.list_parent_indices(lists).to_numpy(zero_copy_only=False), np.int64)
        pos = np.empty(table.num_rows, np.int64)
        pos[rows] = parent
        return grouped.select(self.key_names), pos

    def _probe(self, kt: pa.Table, group: np.ndarray, idx: np.ndarray) -> pa.Table:
        keys = kt.take(pa.array(group))
        return keys.append_column(_SEQ, pa.array(idx, pa.int64()))

    def candidates(self, key_arrays: list[pa.Array]) -> pa.Table:
        """The stored rows whose join key is among ``key_arrays``: the key columns, ``__index``
        (the row's index within its key), the values and ``__matched``."""
        if not key_arrays or not len(key_arrays[0]):
            return self.empty()
        kt, _ = self._distinct(pa.Table.from_arrays(key_arrays, names=self.key_names))
        n = self._counts(kt)
        if not n.any():
            return self.empty()
        probe = self._probe(kt, *self._expand(n))
        values, ok = self.rows.get(probe)
        if not np.asarray(ok, bool).all():
            raise CheckpointError(f"join state {self.rows.path}: a row counted under its key is missing; the state "
                                  "is damaged; start the query over with a new checkpointLocation")  # fmt: skip
        return pa.Table.from_arrays(
            [*probe.columns, *values.columns], names=[*probe.column_names, *values.column_names]
        )

    def empty(self) -> pa.Table:
        return pa.schema([*self.rows.key_schema, *self.rows.value_schema]).empty_table()

    def add(self, rows: pa.Table, order: pa.Array) -> None:
        """Store ``rows`` (the key columns, then the values and ``__matched``; a ``__index``
        column is replaced), ``order`` their eviction times (µs, null: never)."""
        if not rows.num_rows:
            return
        kt, pos = self._distinct(rows)
        n_old = self._counts(kt)
        # each row's rank among the batch's rows of its key (rows in order)
        order_in = np.argsort(pos, kind="stable")
        sizes = np.bincount(pos, minlength=kt.num_rows)
        rank = np.empty(rows.num_rows, np.int64)
        rank[order_in] = np.arange(rows.num_rows, dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        idx = n_old[pos] + rank
        keys = rows.select(self.key_names).append_column(_SEQ, pa.array(idx, pa.int64()))
        self.rows.put(keys, rows.select(self.rows.value_schema.names), order)
        self.keys.put(kt, pa.table({"__n": pa.array(n_old + sizes, pa.int64())}))

    def set_matched(self, rows: pa.Table, order: pa.Array) -> None:
        """Mark stored ``rows`` (from :meth:`candidates`) matched."""
        if not rows.num_rows:
            return
        ks, vs = self.rows.key_schema.names, self.rows.value_schema.names
        rows = rows.set_column(rows.schema.get_field_index(_MATCHED), _MATCHED,
                               pa.array(np.ones(rows.num_rows, bool)))  # fmt: skip
        self.rows.put(rows.select(ks), rows.select(vs), order)

    def evict(self, upto: int) -> pa.Table:
        """Remove every row whose eviction time is ``<= upto`` µs; returns them. The key's
        remaining rows with an index past its new count move into the holes (Spark's
        compaction)."""
        out = self.rows.evict(upto)
        if out.num_rows:
            self._close_holes(out)
        return out

    def remove(self, rows: pa.Table) -> None:
        """Remove stored ``rows`` (from :meth:`candidates`), closing their holes as
        :meth:`evict` does."""
        if not rows.num_rows:
            return
        self.rows.remove(rows.select(self.rows.key_schema.names))
        self._close_holes(rows)

    def _close_holes(self, out: pa.Table) -> None:
        """After ``out`` (key columns and ``__index``) left: each key's rows past its new count
        move into the holes, and its count is updated."""
        kt, pos = self._distinct(out)
        n = self._counts(kt)
        gone = np.bincount(pos, minlength=kt.num_rows)
        m = n - gone
        base = np.int64(1) << np.int64(40)  # (group, index) as one integer
        removed = pos * base + np.asarray(out.column(_SEQ).to_numpy(zero_copy_only=False), np.int64)
        # the tail [m, n) of each key: its rows still there move to the holes below m
        tg, ti = self._expand(gone)
        ti = ti + m[tg]
        tail = tg * base + ti
        movers = np.sort(tail[~np.isin(tail, removed)])
        holes = np.sort(removed[(removed % base) < m[removed // base]])
        if len(movers):
            src = self._probe(kt, movers // base, movers % base)
            values, ok = self.rows.get(src)
            if not np.asarray(ok, bool).all():
                raise CheckpointError(f"join state {self.rows.path}: a row counted under its key is missing; the "
                                      "state is damaged; start the query over with a new checkpointLocation")  # fmt: skip
            dst = self._probe(kt, holes // base, holes % base)
            self.rows.remove(src)
            self.rows.put(dst, values, self.order_of(values))
        keep = np.flatnonzero(m > 0)
        if len(keep):
            self.keys.put(kt.take(pa.array(keep)), pa.table({"__n": pa.array(m[keep], pa.int64())}))
        drop = np.flatnonzero(m <= 0)
        if len(drop):
            self.keys.remove(kt.take(pa.array(drop)))

    def __len__(self) -> int:
        return len(self.rows)


# ------------------------------------------------------------------------------------------ operator


class StreamStreamJoinOperator(TwoInputs, StatefulOperator):
    """``left.join(right, on, how)`` where both are streams (see the module's docstring).

    ``left_steps``/``right_steps`` are each side's own plan; ``left_sources`` how many of the
    query's sources are the left side's (the rest are the right's); ``aliases`` the sides'
    ``alias()`` names for a SQL condition."""

    operator_name: ClassVar[str] = "symmetricHashJoin"
    supports_real_time: ClassVar[bool] = False
    real_time_reason: ClassVar[str] = (
        "stream-stream joins are not supported in real-time mode (only broadcast stream-static joins are)"
    )
    output_modes: ClassVar[tuple[str, ...] | None] = ("append",)
    what: ClassVar[str] = "join() of two streams"

    def __init__(self, left_steps: Sequence[Operator], right_steps: Sequence[Operator], left_sources: int,
                 on: Any, how: str = "inner", aliases: tuple[str | None, str | None] = (None, None),
                 schemas: tuple[pa.Schema | None, pa.Schema | None] = (None, None)) -> None:  # fmt: skip
        super().__init__()
        self.how = join_type(how)
        self.on = on
        self.aliases = aliases
        self._init_sides(left_steps, right_steps, left_sources)
        from headrace.transforms.spark_sql import current_sql_dialect

        self.dialect = current_sql_dialect()
        self._cond: JoinCondition | None = None
        self._out_schema: pa.Schema | None = None
        self._sides: tuple[_SideState, _SideState] | None = None
        self._buf: tuple[list[pa.Table], list[pa.Table]] = ([], [])

    # ------------------------------------------------------------------ planning
    @property
    def name(self) -> str:
        return f"join(stream, on={self.on!r}, how={self.how!r})"

    def describe(self) -> str:
        return self.name

    def event_columns(self, schemas: tuple[pa.Schema, pa.Schema]) -> tuple[str | None, str | None]:
        """Each side's event-time column: its last ``with_watermark``'s, while the side's
        output keeps it (Spark's watermark metadata)."""
        out: list[str | None] = []
        for side in (0, 1):
            cols = [op.column for op in self.steps[side] if isinstance(op, WatermarkOperator)]
            out.append(cols[-1] if cols and cols[-1] in schemas[side].names else None)
        return out[0], out[1]

    def check_plan(self, left: pa.Schema, right: pa.Schema) -> JoinCondition:
        """Parse the condition against the sides' schemas and refuse what Spark refuses.
        Called when the frame is defined (schemas known) and when the query starts."""
        event = self.event_columns((left, right))
        cond = parse_condition(self.on, left, right, self.aliases, event, self.dialect)
        if not cond.keys:
            raise UnsupportedError(
                f"{self.name}: Stream-stream join without equality predicate is not supported; "
                "add an equality between a left and a right column (l.key = r.key)"
            )
        for lcol, rcol in cond.keys:
            lt, rt = left.field(lcol).type, right.field(rcol).type
            if lt != rt and not (pa.types.is_timestamp(lt) and pa.types.is_timestamp(rt)):
                raise ExpressionError(f"{self.name}: key {lcol} is {lt} on the left but {rcol} is {rt} on the right; "
                                      "cast one side first")  # fmt: skip
        self._cond = cond
        self._event = event
        from headrace.transforms.stateless import SqlOperator, where_query

        self._side_where = tuple(
            SqlOperator(where_query(" AND ".join(f"({t})" for t in cond.one_side[side])),
                        what=f"{self.name}: the {('left', 'right')[side]} side's own conditions", dialect="duckdb")
            if cond.one_side[side] and side in _FILTERED_SIDES.get(self.how, ()) else None
            for side in (0, 1)
        )  # fmt: skip
        # a preserved side's own conjuncts (Spark's preJoinFilter): a row failing them never
        # matches, so it is emitted with NULLs for the other side in its own batch, not kept
        preserved = {"left_outer": (0,), "right_outer": (1,), "full_outer": (0, 1)}.get(self.how, ())
        self._preserved_where: tuple[str | None, ...] = tuple(
            " AND ".join(f"({t})" for t in cond.one_side[side]) if cond.one_side[side] and side in preserved else None
            for side in (0, 1)
        )
        self._evict_key = self._key_eviction(cond, event)
        bounds: list[list[_Bound]] = [[], []]
        for b in cond.bounds:
            bounds[b.side].append(b)
        self._bounds = bounds
        need = {"left_outer": (0,), "right_outer": (1,), "full_outer": (0,), "left_semi": (0,)}.get(
            self.how, ()
        )
        for side in need:
            if not self._evictable(side):
                other = ("right", "left")[side]
                raise UnsupportedError(
                    f"{self.name}: Stream-stream {_SPARK_NAME[self.how]} join between two streaming "
                    "DataFrame/Datasets is not supported without a watermark in the join keys, or a watermark on "
                    "the nullable side and an appropriate range condition; add with_watermark on both sides and a "
                    f"condition bounding the {('left', 'right')[side] if self.how != 'full_outer' else 'one'} side's "
                    f"event time by the {other if self.how != 'full_outer' else 'other'} side's "
                    '(e.g. "l.ts BETWEEN r.ts - INTERVAL 1 HOUR AND r.ts")'
                )
        return cond

    def _key_eviction(self, cond: JoinCondition, event: tuple[str | None, str | None]) -> int | None:
        """The index of the first key pair holding a side's event-time column (Spark's watermark
        in the join keys), or None."""
        for i, (lcol, rcol) in enumerate(cond.keys):
            if (event[0] is not None and lcol == event[0]) or (event[1] is not None and rcol == event[1]):
                return i
        return None

    def _evictable(self, side: int) -> bool:
        """Spark's check of an outer or semi join: a watermark in the join keys, or a condition
        bounding ``side`` by the other side's watermarked event time (a full outer join needs
        it on either side)."""
        if self._evict_key is not None:
            return True
        if self.how == "full_outer":
            return bool(self._bounds[0] or self._bounds[1])
        return bool(self._bounds[side])

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        if self._side_schemas is None:
            raise HeadraceError(f"{self.name}: bind_sources() must be called before output_schema()")
        left, right = self._side_schemas
        cond = self.check_plan(left, right)
        self._input_schema = input_schema
        fields: list[pa.Field] = []
        nullable_l = self.how in ("right_outer", "full_outer")
        nullable_r = self.how in ("left_outer", "full_outer")
        if self.how == "left_semi":
            self._out_schema = left
            return left
        if cond.using:
            keyset = {k for k, _ in cond.keys}
            for lcol, _ in cond.keys:
                f = left.field(lcol)
                fields.append(f.with_nullable(f.nullable or (self.how == "full_outer")))
            fields += [f.with_nullable(True) if nullable_l else f for f in left if f.name not in keyset]
            fields += [f.with_nullable(True) if nullable_r else f for f in right if f.name not in keyset]
        else:
            clash = sorted(set(left.names) & set(right.names))
            if clash:
                raise ExpressionError(
                    f"{self.name}: both sides have column(s) {clash}; rename them on one side first "
                    "(with_column_renamed) so the output has distinct names"
                )
            fields += [f.with_nullable(True) if nullable_l else f for f in left]
            fields += [f.with_nullable(True) if nullable_r else f for f in right]
        self._out_schema = pa.schema(fields)
        return self._out_schema

    def check_output_mode(self, mode: str) -> None:
        if mode != "append":
            raise UnsupportedError(
                f"{self.name}: Join between two streaming DataFrames/Datasets is not supported in {mode.title()} "
                "output mode, only in Append output mode; use output_mode('append')"
            )

    def side_filters(self, side: int) -> list[Any]:
        """The filters Spark moves from the join into a side, over the side's columns:
        ``IS NOT NULL`` on the columns of the condition's null-intolerant comparisons (its
        InferFiltersFromConstraints) and the conjuncts on that side alone (its
        PushPredicateThroughJoin), for the sides the join type lets it filter: both sides of
        an inner or left semi join, the right side of a left outer join, the left side of a
        right outer one, neither side of a full outer one. They decide which rows move the
        side's watermark (:mod:`headrace.transforms.watermark_filters`)."""
        cond = self._cond
        if cond is None or side not in _FILTERED_SIDES.get(self.how, ()):
            return []
        import sqlglot
        from sqlglot import exp

        out: list[Any] = [exp.Not(this=exp.Is(this=exp.column(c, quoted=True), expression=exp.Null()))
                          for c in cond.not_null[side]]  # fmt: skip
        out += [sqlglot.parse_one(text, read="duckdb") for text in cond.one_side[side]]
        return out

    def state_spec(self) -> dict[str, Any]:
        assert self._cond is not None and self._side_schemas is not None
        return {
            "operator": self.operator_name,
            "joinType": self.how,
            "keys": [f"{a}={b}" for a, b in self._cond.keys],
            "condition": self._cond.residual,
            "leftColumns": [f"{f.name}: {f.type}" for f in self._side_schemas[0]],
            "rightColumns": [f"{f.name}: {f.type}" for f in self._side_schemas[1]],
            "eventTime": [c for c in self._event],
        }

    def _state_schemas(self) -> tuple[pa.Schema, pa.Schema]:  # the left side's rows store
        return self._schemas_of(0)

    def _key_fields(self, side: int) -> list[pa.DataType]:
        assert self._cond is not None and self._side_schemas is not None
        types: list[pa.DataType] = []
        for pair in self._cond.keys:
            t = self._side_schemas[side].field(pair[side]).type
            if pa.types.is_struct(t):
                types += [t.field(i).type for i in range(t.num_fields)]
            else:
                types.append(t)
        return [pa.timestamp("us", tz=t.tz) if pa.types.is_timestamp(t) else t for t in types]

    def _schemas_of(self, side: int) -> tuple[pa.Schema, pa.Schema]:
        assert self._side_schemas is not None
        keys = [pa.field(f"__k{i}", t) for i, t in enumerate(self._key_fields(side))]
        rows_key = pa.schema([*keys, pa.field(_SEQ, pa.int64())])
        value = pa.schema([*self._side_schemas[side], pa.field(_MATCHED, pa.bool_())])
        return rows_key, value

    # ------------------------------------------------------------------ life cycle
    def open(self, context: OperatorContext) -> None:
        """Open the four stores (each side's keys and rows) under ``context.state_path``, and
        the sides' own steps."""
        import os

        from headrace.state import open_state_store

        if context.state_path is None:
            raise HeadraceError(
                f"{self.describe()} keeps state and needs a checkpoint folder (state_path is None)"
            )
        self.check_output_mode(context.output_mode)
        self._context = context
        self._open_sides(context)
        opts = context.options or {}
        last = opts.get("lastCommittedBatch")
        first = os.path.join(context.state_path, "left-rows")
        if last is not None and int(last) >= 0 and not os.path.lexists(os.path.join(first, "metadata")):
            raise CheckpointError(self._no_state_message(context, int(last)))
        spec = self.state_spec()
        sides = []
        for side, label in ((0, "left"), (1, "right")):
            rows_key, value = self._schemas_of(side)
            key_schema = pa.schema(list(rows_key)[:-1])
            stores = []
            for kind, ks, vs in (("keys", key_schema, pa.schema([pa.field("__n", pa.int64())])),
                                 ("rows", rows_key, value)):  # fmt: skip
                stores.append(open_state_store(
                    context.state_backend, os.path.join(context.state_path, f"{label}-{kind}"), ks, vs,
                    retain=context.retain, snapshot_interval=int(opts.get("stateSnapshotInterval", 10)),
                    durable=bool(opts.get("checkpointFsync", True)), description=f"{self.describe()} {label}-{kind}",
                    operator_spec={**spec, "store": f"{label}-{kind}"}, query_id=context.query_id,
                    operator_id=f"{context.index}:{self.operator_name}:{label}-{kind}",
                ))  # fmt: skip
            sides.append(_SideState(stores[0], stores[1], len(rows_key) - 1,
                                    lambda t, side=side: self._orders(side, t)))  # type: ignore[misc]  # fmt: skip
        self._sides = (sides[0], sides[1])
        self._store = sides[0].rows  # the base class's metrics and checks look at one store

    def _stores(self) -> list[Any]:
        return [] if self._sides is None else [s for side in self._sides for s in (side.keys, side.rows)]

    def begin(self, batch: BatchInfo) -> None:
        """Load every store at version ``batch_id - 1``; begin the sides' steps."""
        for s in self._stores():
            s.load(batch.batch_id - 1)
        self._begin_sides(batch)
        self._buf = ([], [])
        self._dropped = 0
        self._t_batch = time.monotonic()

    def process(self, table: pa.Table, batch: BatchInfo) -> pa.Table | None:
        side = side_of(table, self.name)
        if table.num_rows:
            self._buf[side].append(table.replace_schema_metadata(None))
        return None

    # ------------------------------------------------------------------ the batch
    def _side_input(self, side: int, batch: BatchInfo) -> pa.Table:
        assert self._side_schemas is not None and self._cond is not None
        schema = self._side_schemas[side]
        parts = [t.cast(schema) if t.schema != schema else t for t in self._buf[side]]
        table = pa.concat_tables(parts) if parts else schema.empty_table()
        if not table.num_rows:
            return table
        # Spark filters a side before the join (and before its watermark; see side_filters):
        # a row with a NULL in a column of the condition's equalities and comparisons, or
        # failing a conjunct on that side alone, never matches; not on the preserved side of an
        # outer join (where such rows wait, unmatched)
        if side in _FILTERED_SIDES.get(self.how, ()):
            mask = None
            for name in self._cond.not_null[side]:
                v = pc.is_valid(table.column(name))
                mask = v if mask is None else pc.and_(mask, v)
            if mask is not None and not pc.all(mask).as_py():
                table = table.filter(mask)
            where = self._side_where[side]
            if where is not None and table.num_rows:
                table = where.process(table, batch) or table.slice(0, 0)
        col = self._event[side]
        if col is not None and batch.late_ms is not None and table.num_rows:
            us = _time_us(table.column(col))
            late = pc.fill_null(pc.less_equal(us, batch.late_ms * 1000), False)
            n_late = int(pc.sum(late).as_py() or 0)
            if n_late:
                self._dropped += n_late
                table = table.filter(pc.invert(late))
        return table

    def _state_threshold(self, side: int, wm_ms: int | None) -> int | None:
        """The eviction bound (µs, inclusive) of a side's rows at watermark ``wm_ms``, or None."""
        if wm_ms is None:
            return None
        if self._evict_key is not None:
            return wm_ms * 1000
        if self._event[side] is None or self._event[1 - side] is None or not self._bounds[side]:
            return None
        marks = []
        for b in self._bounds[side]:
            # state > other + c: rows of other side to come have other > wm -> evict state <= wm + c
            ms = (wm_ms * 1000 + b.const_us) // 1000
            marks.append(ms if b.strict else ms - 1)
        return min(marks) * 1000

    def _orders(self, side: int, table: pa.Table) -> pa.Array:
        """Each row's eviction time (µs), null where it is never evicted by time."""
        assert self._cond is not None
        if self._evict_key is not None:
            col = self._cond.keys[self._evict_key][side]
            arr = table.column(col).combine_chunks()
            if pa.types.is_struct(arr.type):  # a window: evicted when the watermark passes its end
                arr = arr.field(arr.type.num_fields - 1)
            return _time_us(arr)
        event_col = self._event[side]
        if event_col is None or not self._bounds[side]:
            return pa.nulls(table.num_rows, pa.int64())
        return _time_us(table.column(event_col))

    def _with_keys(self, side: int, table: pa.Table, seq0: int) -> pa.Table:
        """``table`` with the flat key columns ``__k*`` and ``__index`` in front."""
        assert self._cond is not None
        keys = _flat_keys(table, [p[side] for p in self._cond.keys])
        keys = [
            pc.cast(k, pa.timestamp("us", tz=k.type.tz)) if pa.types.is_timestamp(k.type) else k for k in keys
        ]
        seq = pa.array(np.arange(seq0, seq0 + table.num_rows, dtype=np.int64))
        names = [f"__k{i}" for i in range(len(keys))]
        return pa.Table.from_arrays([*keys, seq, *table.columns], names=[*names, _SEQ, *table.column_names])

    def _pairs(self, left: pa.Table, right: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """Row-number pairs (left, right) that satisfy the join condition."""
        assert self._cond is not None
        if not left.num_rows or not right.num_rows:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        lt = left.append_column(_ROW, pa.array(np.arange(left.num_rows, dtype=np.int64)))
        rt = right.append_column(_ROW, pa.array(np.arange(right.num_rows, dtype=np.int64)))
        # a full outer join matches NULL keys with each other, as Spark's does (it compares the
        # keys' bytes, and infers no IS NOT NULL filter for a full outer join)
        eq = "IS NOT DISTINCT FROM" if self.how == "full_outer" else "="
        on = " AND ".join(f"l.{quote_ident(a)} {eq} r.{quote_ident(b)}" for a, b in self._cond.keys)
        if self._cond.residual:
            on += f" AND ({self._cond.residual})"
        query = f"SELECT l.{_ROW} AS li, r.{_ROW} AS ri FROM l JOIN r ON {on}"
        out = self._sql2(lt, rt, query)
        return (
            np.asarray(out.column("li").to_numpy(), np.int64),
            np.asarray(out.column("ri").to_numpy(), np.int64),
        )

    def _sql2(self, left: pa.Table, right: pa.Table, query: str) -> pa.Table:
        con = self._con
        if con is None:
            import duckdb

            con = self._con = duckdb.connect(":memory:")
            con.execute("SET TimeZone = 'UTC'")
        con.register("l", left)
        con.register("r", right)
        try:
            return con.sql(query).to_arrow_table()
        except Exception as e:
            raise ExpressionError(
                f"{self.name}: the join condition failed: {str(e).splitlines()[0]}"
            ) from None
        finally:
            con.unregister("l")
            con.unregister("r")

    def _output(self, left: pa.Table | None, right: pa.Table | None, n: int) -> pa.Table:
        """Output rows from aligned left and right rows (None: NULLs for that side)."""
        assert self._out_schema is not None and self._cond is not None and self._side_schemas is not None
        if self.how == "left_semi":
            assert left is not None
            return left.select(self._out_schema.names).cast(self._out_schema)
        cols: list[Any] = []
        lnames, rnames = self._side_schemas[0].names, self._side_schemas[1].names

        def col(t: pa.Table | None, name: str, typ: pa.DataType) -> Any:
            return t.column(name) if t is not None else pa.nulls(n, typ)

        if self._cond.using:
            keyset = set()
            for lcol, rcol in self._cond.keys:
                keyset.add(lcol)
                typ = self._out_schema.field(lcol).type
                if left is not None and right is not None:
                    cols.append(pc.coalesce(left.column(lcol), right.column(rcol)) if self.how == "full_outer"
                                else left.column(lcol))  # fmt: skip
                elif left is not None:
                    cols.append(left.column(lcol))
                else:
                    assert right is not None
                    cols.append(right.column(rcol))
                _ = typ
            cols += [col(left, c, self._side_schemas[0].field(c).type) for c in lnames if c not in keyset]
            cols += [col(right, c, self._side_schemas[1].field(c).type) for c in rnames if c not in keyset]
        else:
            cols += [col(left, c, self._side_schemas[0].field(c).type) for c in lnames]
            cols += [col(right, c, self._side_schemas[1].field(c).type) for c in rnames]
        arrays = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in cols]
        arrays = [
            a.cast(f.type) if a.type != f.type else a for a, f in zip(arrays, self._out_schema, strict=True)
        ]
        return pa.Table.from_arrays(arrays, schema=self._out_schema)

    def finish(self, batch: BatchInfo) -> pa.Table | None:
        assert self._sides is not None and self._side_schemas is not None
        outs: list[pa.Table] = []
        updated = removed_matched = 0
        semi = self.how == "left_semi"
        seq0 = batch.batch_id << 32
        raw = [self._side_input(s, batch) for s in (0, 1)]
        for s in (0, 1):  # Spark's pre-join filter of a preserved side: a row failing it is out at once
            check = self._preserved_where[s]
            if check is not None and raw[s].num_rows:
                ok = condition_mask(raw[s], check)
                if not pc.all(ok).as_py():
                    failing = raw[s].filter(pc.invert(ok))
                    raw[s] = raw[s].filter(ok)
                    outs.append(self._output(failing, None, failing.num_rows) if s == 0
                                else self._output(None, failing, failing.num_rows))  # fmt: skip
        inputs = [self._with_keys(s, raw[s], seq0) for s in (0, 1)]
        thresholds = [self._state_threshold(s, batch.watermark_ms) for s in (0, 1)]
        # Spark's order: the left rows, then the right rows; a left semi join takes the right
        # rows first, so a left row matching a row of its own batch is emitted and never kept
        for side in (1, 0) if semi else (0, 1):
            this, other_state, own_state = inputs[side], self._sides[1 - side], self._sides[side]
            if not this.num_rows:
                continue
            cand = other_state.candidates(this.columns[: own_state.n_key])
            lt, rt = (this, cand) if side == 0 else (cand, this)
            li, ri = self._pairs(lt, rt)
            this_idx, other_idx = (li, ri) if side == 0 else (ri, li)
            matched = np.zeros(this.num_rows, bool)
            matched[this_idx] = True
            if semi and side == 1:  # a left row is emitted once: only state rows not matched before
                keep = ~np.asarray(cand.column(_MATCHED).to_numpy(zero_copy_only=False), bool)[other_idx]
                this_idx, other_idx = this_idx[keep], other_idx[keep]
                firsts = np.unique(other_idx, return_index=True)[1]
                this_idx, other_idx = this_idx[firsts], other_idx[firsts]
                outs.append(self._output(cand.take(pa.array(other_idx)), None, len(other_idx)))
            elif semi:  # side 0: a left row matching anything is emitted once, not stored
                hit = np.flatnonzero(matched)
                outs.append(self._output(this.take(pa.array(hit)), None, len(hit)))
            elif len(this_idx):
                a, b = this.take(pa.array(this_idx)), cand.take(pa.array(other_idx))
                outs.append(
                    self._output(a, b, len(this_idx)) if side == 0 else self._output(b, a, len(this_idx))
                )
            if len(other_idx) and semi and side == 1:  # an emitted left row is done: Spark drops it
                hit_rows = cand.take(pa.array(np.unique(other_idx)))
                other_state.remove(hit_rows)
                removed_matched += hit_rows.num_rows
            elif len(other_idx) and (self.how != "inner"):
                hit_rows = cand.take(pa.array(np.unique(other_idx)))
                hit_rows = hit_rows.filter(pc.invert(hit_rows.column(_MATCHED)))
                other_state.set_matched(hit_rows, self._orders(1 - side, hit_rows))
            # store this side's rows (Spark's rule): the left rows always (this batch's right rows
            # are still to come), but a left semi row that matched; the right rows unless the
            # watermark evicts them at the end of this batch, except an unmatched row of a right
            # or full outer join (its eviction emits it)
            orders = self._orders(side, this)
            store = np.ones(this.num_rows, bool)
            th = thresholds[side]
            if side == 1 and th is not None:
                evicting = np.asarray(
                    pc.fill_null(pc.less_equal(orders, th), False).to_numpy(zero_copy_only=False)
                )
                if self.how in ("right_outer", "full_outer"):
                    evicting &= matched
                store &= ~evicting
            if semi and side == 0:
                store &= ~matched
            idx = np.flatnonzero(store)
            if len(idx):
                rows = this.take(pa.array(idx))
                rows = rows.append_column(_MATCHED, pa.array(matched[idx]))
                own_state.add(rows.select([*own_state.rows.key_schema.names, *own_state.rows.value_schema.names]),
                              orders.take(pa.array(idx)))  # fmt: skip
                updated += len(idx)
        removed = removed_matched
        for side in (0, 1):
            th = thresholds[side]
            if th is None:
                continue
            gone = self._sides[side].evict(th)
            removed += gone.num_rows
            if not gone.num_rows:
                continue
            emits = (side == 0 and self.how in ("left_outer", "full_outer")) or (
                side == 1 and self.how in ("right_outer", "full_outer")
            )
            if emits:
                unmatched = gone.filter(pc.invert(gone.column(_MATCHED)))
                if unmatched.num_rows:
                    outs.append(self._output(unmatched, None, unmatched.num_rows) if side == 0
                                else self._output(None, unmatched, unmatched.num_rows))  # fmt: skip
        self._commit_all(batch, updated, removed)
        outs = [o for o in outs if o.num_rows]
        return pa.concat_tables(outs) if outs else None

    def _commit_all(self, batch: BatchInfo, updated: int, removed: int) -> None:
        t = time.monotonic()
        for s in self._stores():
            s.commit(batch.batch_id, wait=False)
        batch.dropped_by_watermark += self._dropped
        self._dropped_total += self._dropped
        assert self._sides is not None
        total = len(self._sides[0]) + len(self._sides[1])
        mem = sum(int(s.memory_used_bytes()) for s in self._stores()) if self._context else 0
        self._metrics = {
            "operatorName": self.operator_name, "numRowsTotal": total, "numRowsUpdated": updated,
            "numRowsRemoved": removed, "numRowsDroppedByWatermark": self._dropped,
            "allUpdatesTimeMs": int((t - self._t_batch) * 1000), "commitTimeMs": int((time.monotonic() - t) * 1000),
            "memoryUsedBytes": mem, "numShufflePartitions": 1, "numStateStoreInstances": 4,
            "stateStore": self._sides[0].rows.backend,
        }  # fmt: skip

    def state_write(self) -> StateWrite | None:
        pending = [w for w in (s.pending_write() for s in self._stores()) if w is not None]
        if not pending:
            return None
        return _AllWrites(pending)

    def needs_batch_at(self, watermark_ms: int) -> bool:
        """Spark's ``shouldRunAnotherBatch``: a state watermark is defined on a side."""
        return any(self._state_threshold(s, watermark_ms) is not None for s in (0, 1))

    def close(self) -> None:
        try:
            self._close_sides()
        except Exception as e:
            log.warning("closing %s's sides failed: %s", self.name, e)
        for s in self._stores():
            s.close()
        self._sides = None
        self._store = None
        if self._con is not None:
            self._con.close()
            self._con = None


class _AllWrites:
    """Several stores' pending writes, waited for together."""

    def __init__(self, writes: list[StateWrite]) -> None:
        self.writes = writes

    def result(self, timeout: float | None = None) -> Any:
        for w in self.writes:
            w.result(timeout)
        return None
