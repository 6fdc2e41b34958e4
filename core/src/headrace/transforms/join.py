"""Stream-static joins: each micro-batch joined with a snapshot of a static table.

The static side (a ``StaticFrame`` or a ``pyarrow.Table``) is read when the query starts
(``open``) and kept for the whole run: changes made to it later are not seen until the query
restarts (the "stream snapshot join" of Lakeflow pipelines). Each batch (each chunk in
real-time mode) is joined by DuckDB over Arrow, with the static side registered as ``static``.

``on`` is a column name or a list of them (an equi-join; the key columns appear once, first,
as in Spark), or a SQL condition over ``batch`` and ``static`` (``"event_key = lookup_key"``).

``how`` is read through one table of Spark's spellings, :data:`JOIN_TYPES` (case and
underscores ignored, as Spark's ``JoinType``): a stream-static join takes the types Spark runs
with the stream on the left (:data:`STREAM_STATIC_JOIN_TYPES`: inner, left outer, left semi,
left anti; Spark refuses right and full outer joins there, and so does this operator), a join
of two static tables (:func:`join_tables`) takes them all. Semi and anti joins keep the
stream's columns only (the keys first, then the others), each row at most once.

DuckDB hashes the smaller side of each join, so a chunk of a few rows against a large static
table costs a scan of the static side (~4 ms per 100k static rows). For small chunks of an
equi-join (real-time mode, tiny micro-batches) the operator instead looks the keys up in a
hash index of the static side built once per run: a chunk of 100 rows then costs well under a
millisecond whatever the static side's size. Both paths give the same rows and columns.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from headrace.errors import HeadraceError
from headrace.transforms.expressions import ExpressionError, check_syntax, is_identifier, quote_ident, run_sql
from headrace.transforms.operator import BatchInfo, Operator, OperatorContext

__all__ = ["JOIN_TYPES", "STREAM_STATIC_JOIN_TYPES", "StaticTable", "StreamStaticJoinOperator", "join_tables", "join_type"]

log = logging.getLogger(__name__)


@runtime_checkable
class StaticTable(Protocol):
    """The static side of a join, or a transform_with_state's initial state: what the operators
    need of a static frame (``hr.read...load()``, a pipeline's ``dp.read``), not its class.
    ``schema`` is asked when the query is planned, ``to_arrow()`` once when the query starts,
    both on the thread starting it."""

    @property
    def schema(self) -> pa.Schema: ...

    def to_arrow(self) -> pa.Table: ...


#: Spark's spellings of a join's ``how``, lower-cased without underscores (as Spark's
#: ``JoinType`` reads them) -> the join type: inner, left, right, full, left_semi or left_anti
JOIN_TYPES: dict[str, str] = {
    "inner": "inner", "cross": "inner",
    "left": "left", "leftouter": "left",
    "right": "right", "rightouter": "right",
    "full": "full", "outer": "full", "fullouter": "full",
    "semi": "left_semi", "leftsemi": "left_semi",
    "anti": "left_anti", "leftanti": "left_anti",
}  # fmt: skip
#: the join types of a stream-static join (the stream on the left), as in Spark: a right or full
#: outer join would have to know that no row of the whole stream ever matches a static row
STREAM_STATIC_JOIN_TYPES = ("inner", "left", "left_semi", "left_anti")
_SQL_JOIN = {"inner": "JOIN", "left": "LEFT JOIN"}
_ARROW_JOIN = {"inner": "inner", "left": "left outer", "right": "right outer", "full": "full outer",
               "left_semi": "left semi", "left_anti": "left anti"}  # fmt: skip


def join_type(how: str, *, stream_static: bool = False) -> str:
    """The join type ``how`` spells (``"left_outer"`` -> ``"left"``, ``"semi"`` ->
    ``"left_semi"``); raises :class:`HeadraceError` for an unknown one, and with
    ``stream_static`` for one a stream-static join cannot run. Called once per ``join()``."""
    jt = JOIN_TYPES.get(str(how).lower().replace("_", ""))
    if jt is None:
        raise HeadraceError(
            f"join(how={how!r}) is no join type; use inner, left (left_outer), right (right_outer), "
            "full (outer, full_outer), left_semi (semi) or left_anti (anti)"
        )
    if stream_static and jt not in STREAM_STATIC_JOIN_TYPES:
        raise HeadraceError(
            f"join(how={how!r}): a stream-static join is 'inner', 'left', 'left_semi' or 'left_anti' (the stream on "
            "the left, as in Spark); right and full joins would need state over the whole stream"
        )
    return jt


def join_tables(left: pa.Table, right: pa.Table, on: str | Sequence[str], how: str = "inner") -> pa.Table:
    """``left`` joined with ``right`` on equal ``on`` columns, any join type (Spark's ``how``
    names); the columns as Spark's: the keys once, first, then the left's others, then the
    right's (none of the right's for semi and anti joins). NULL keys match nothing. Called
    once per join of two static tables, when the joined frame is read."""
    jt = join_type(how)
    keys = [on] if isinstance(on, str) else list(on)
    if not keys:
        raise HeadraceError("join(on=...) needs at least one key column")
    for side, t in (("left", left), ("right", right)):
        missing = [k for k in keys if k not in t.column_names]
        if missing:
            raise HeadraceError(f"join on {keys}: the {side} side has no column {missing} (columns: {t.column_names})")
    keyset = set(keys)
    rest_l = [c for c in left.column_names if c not in keyset]
    rest_r = [c for c in right.column_names if c not in keyset] if jt not in ("left_semi", "left_anti") else []
    clash = sorted(set(rest_l) & set(rest_r))
    if clash:
        raise HeadraceError(f"join on {keys}: both sides have non-key column(s) {clash}; rename or drop them on one "
                            "side first so the output has distinct names")  # fmt: skip
    out = left.join(right, keys=keys, join_type=_ARROW_JOIN[jt], coalesce_keys=True, use_threads=False)
    return out.select([*keys, *rest_l, *rest_r])


SMALL_CHUNK_ROWS = 2048  # up to this many rows, an equi-join probes the prebuilt index


class StreamStaticJoinOperator(Operator):
    """``stream.join(static, on=..., how="inner"|"left"|"left_semi"|"left_anti")``."""

    stateful = False
    supports_real_time = True

    def __init__(self, static: StaticTable | pa.Table, on: str | Sequence[str], how: str = "inner") -> None:
        self.how = join_type(how, stream_static=True)
        self.static = static
        self.on = on
        self.keys: list[str] | None
        self.condition: str | None
        if isinstance(on, str) and not is_identifier(on):
            from headrace.transforms.spark_sql import current_sql_dialect, to_duckdb

            self.keys, self.condition = None, on
            if current_sql_dialect() == "spark":  # the condition is Spark SQL
                self.condition = to_duckdb(on, what=f"join(on={on!r})", kind="expression")
            check_syntax(f"SELECT * FROM batch JOIN static ON ({self.condition})", what=f"join(on={on!r})")  # fmt: skip
        else:
            keys = [on] if isinstance(on, str) else list(on)
            if not keys:
                raise HeadraceError("join(on=...) needs at least one key column (or a SQL condition)")
            self.keys, self.condition = keys, None
        self._snapshot: pa.Table | None = None
        self._query: str | None = None
        self._index: dict[Any, list[int]] | None = None
        self._out_schema: pa.Schema | None = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        on = self.on if isinstance(self.on, str) and self.keys is None else self.keys
        return f"join(on={on!r}, how={self.how!r})"

    def _static_schema(self) -> pa.Schema:
        if self._snapshot is not None:
            return self._snapshot.schema
        if isinstance(self.static, pa.Table):
            return self.static.schema
        return self.static.schema

    @property
    def _existence(self) -> str | None:
        """``EXISTS`` for a semi join, ``NOT EXISTS`` for an anti join, None otherwise."""
        return {"left_semi": "EXISTS", "left_anti": "NOT EXISTS"}.get(self.how)

    def _build_query(self, left: Sequence[str], right: Sequence[str]) -> str:
        exists = self._existence
        if exists is not None and self.keys is None:
            return f"SELECT batch.* FROM batch WHERE {exists} (SELECT 1 FROM static WHERE ({self.condition}))"
        join = _SQL_JOIN.get(self.how, "")
        if self.keys is None:
            clash = sorted(set(left) & set(right))
            if clash:
                raise ExpressionError(
                    f"{self.name}: both sides have column(s) {clash}; rename them on one side first "
                    "(with_column_renamed) so the output has distinct names"
                )
            return f"SELECT batch.*, static.* FROM batch {join} static ON ({self.condition})"
        missing_l = [k for k in self.keys if k not in left]
        missing_r = [k for k in self.keys if k not in right]
        if missing_l or missing_r:
            side = f"the stream has no {missing_l} (columns {list(left)})" if missing_l else ""
            if missing_r:
                side += ("; " if side else "") + f"the static side has no {missing_r} (columns {list(right)})"
            raise ExpressionError(f"{self.name}: {side}")
        keyset = set(self.keys)
        rest_l = [c for c in left if c not in keyset]
        cond = " AND ".join(f"batch.{quote_ident(k)} = static.{quote_ident(k)}" for k in self.keys)
        if exists is not None:  # the stream's columns only, keys first (as Spark)
            cols = [f"batch.{quote_ident(c)}" for c in (*self.keys, *rest_l)]
            return f"SELECT {', '.join(cols)} FROM batch WHERE {exists} (SELECT 1 FROM static WHERE {cond})"
        rest_r = [c for c in right if c not in keyset]
        clash = sorted(set(rest_l) & set(rest_r))
        if clash:
            raise ExpressionError(
                f"{self.name}: both sides have non-key column(s) {clash}; rename or drop them on one side "
                "first so the output has distinct names"
            )
        cols = [f"batch.{quote_ident(k)}" for k in self.keys]
        cols += [f"batch.{quote_ident(c)}" for c in rest_l] + [f"static.{quote_ident(c)}" for c in rest_r]
        return f"SELECT {', '.join(cols)} FROM batch {join} static ON {cond}"

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        right = self._static_schema()
        query = self._build_query(input_schema.names, right.names)
        out = run_sql(input_schema.empty_table(), query, what=self.name, extra=[("static", right.empty_table())])
        schema = out.schema
        if self.how == "left":  # static columns may be NULL when no row matches
            schema = pa.schema([f.with_nullable(True) if f.name in right.names else f for f in schema])
        return schema

    def open(self, context: OperatorContext) -> None:
        """Take the snapshot of the static side (read it now, once per query run)."""
        t = time.monotonic()
        self._snapshot = self.static if isinstance(self.static, pa.Table) else self.static.to_arrow()
        self._query = None
        self._index = None
        self._out_schema = None
        self._lock = threading.Lock()
        log.info("%s: static side snapshot of %d rows taken in %.0f ms", self.name, self._snapshot.num_rows,
                 (time.monotonic() - t) * 1000)  # fmt: skip

    def process(self, table: pa.Table, batch: BatchInfo) -> pa.Table | None:
        snap = self._snapshot
        if snap is None:
            raise HeadraceError(f"{self.name} was not opened (the static side is read when the query starts)")
        query = self._query
        if query is None:
            query = self._query = self._build_query(table.column_names, snap.column_names)
        if self.keys is not None and table.num_rows <= SMALL_CHUNK_ROWS:
            return self._lookup(table, snap, query)
        return run_sql(table, query, what=self.name, extra=[("static", snap)])

    def _key_index(self, snap: pa.Table) -> dict[Any, list[int]]:
        """Static key -> its row numbers; built once per run (first small chunk)."""
        with self._lock:
            if self._index is None:
                assert self.keys is not None
                cols = [snap.column(k).to_pylist() for k in self.keys]
                index: dict[Any, list[int]] = {}
                for i, key in enumerate(zip(*cols, strict=True)):
                    if None not in key:  # NULL never equals anything
                        index.setdefault(key, []).append(i)
                self._index = index
            return self._index

    def _lookup(self, table: pa.Table, snap: pa.Table, query: str) -> pa.Table:
        assert self.keys is not None
        index = self._key_index(snap)
        if self._existence is not None:  # semi: rows with a match, anti: rows without one (NULL keys match none)
            semi = self.how == "left_semi"
            cols = [table.column(k).to_pylist() for k in self.keys]
            keep = [i for i, key in enumerate(zip(*cols, strict=True)) if (None not in key and key in index) == semi]
            keyset = set(self.keys)
            out = table.take(pa.array(keep, pa.int64())).select(
                [*self.keys, *(c for c in table.column_names if c not in keyset)]
            )
            schema = self._out_schema
            if schema is None:
                schema = self._out_schema = run_sql(table.schema.empty_table(), query, what=self.name,
                                                    extra=[("static", snap.schema.empty_table())]).schema  # fmt: skip
            return out.cast(schema) if out.schema != schema else out
        left: list[int] = []
        right: list[int | None] = []
        cols = [table.column(k).to_pylist() for k in self.keys]
        for i, key in enumerate(zip(*cols, strict=True)):
            hits = index.get(key) if None not in key else None
            if hits:
                left.extend([i] * len(hits))
                right.extend(hits)
            elif self.how == "left":
                left.append(i)
                right.append(None)
        keyset = set(self.keys)
        lt = table.take(pa.array(left, pa.int64()))
        rt = snap.take(pa.array(right, pa.int64()))
        names = [*self.keys, *(c for c in table.column_names if c not in keyset)]
        arrays = [lt.column(c) for c in names]
        rest = [c for c in snap.column_names if c not in keyset]
        out = pa.Table.from_arrays([*arrays, *(rt.column(c) for c in rest)], names=[*names, *rest])
        schema = self._out_schema
        if schema is None:
            schema = self._out_schema = run_sql(table.schema.empty_table(), query, what=self.name,
                                                extra=[("static", snap.schema.empty_table())]).schema  # fmt: skip
        return out.cast(schema) if out.schema != schema else out

    def close(self) -> None:
        self._snapshot = None
        self._query = None
        self._index = None

    def metrics(self) -> dict[str, Any]:
        return {}
