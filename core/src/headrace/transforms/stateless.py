"""Stateless operators: Python functions over each table, SQL queries and projections.

SQL operators run one DuckDB query per chunk over the table ``batch``; consecutive SQL steps
are fused into one query by the plan (``WITH batch AS (<step 1>) SELECT * FROM (<step 2>)``)
so a chain of ``select_expr``/``where``/``with_column`` costs one DuckDB call per chunk.
Column-only steps (``select`` of names, ``drop``, ``with_column_renamed``) use Arrow directly,
and so do queries in the subset :mod:`headrace.transforms.arrow_eval` compiles to Arrow compute
(column arithmetic, comparisons, simple casts): at any chunk size, they are several times
cheaper than a DuckDB round trip (which has a fixed cost of ~1.5 ms of CPU per query).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from headrace.errors import HeadraceError
from headrace.transforms.expressions import ExpressionError, check_syntax, quote_ident, run_sql
from headrace.transforms.operator import BatchInfo, Operator

__all__ = [
    "DropColumnsOperator",
    "FilterFunctionOperator",
    "MapBatchesOperator",
    "RenameColumnOperator",
    "SchemaUnknown",
    "SelectColumnsOperator",
    "SqlOperator",
    "Transform",
    "WithColumnOperator",
    "spark_string_casts",
    "select_expr_query",
    "where_query",
    "with_column_query",
]

log = logging.getLogger(__name__)

#: a ``map_batches`` function: one table of a batch's rows in, the rows to pass on out
Transform = Callable[[pa.Table], pa.Table]

# What start() works out per (query, input schema), kept for the process: DuckDB's output
# schema and the query compiled to Arrow. Both depend only on the key (DuckDB runs with the
# same settings every time), so a query started again skips ~2 ms of planning per SQL step.
_SCHEMAS: dict[Any, pa.Schema] = {}
_COMPILED: dict[Any, Any] = {}
_REMEMBER = 256  # entries per table (a plain dict: cleared when full, never stale)


def _remembered(table: dict[Any, Any], key: Any) -> Any:
    try:
        return table.get(key)
    except TypeError:  # an unhashable schema (e.g. odd metadata): not cached
        return None


def _remember(table: dict[Any, Any], key: Any, value: Any) -> None:
    try:
        if len(table) >= _REMEMBER:
            table.clear()
        table[key] = value
    except TypeError:
        pass


class SchemaUnknown(Exception):
    """Raised by ``output_schema`` when a step's output cannot be known before data (a Python
    function without a declared schema): the steps after it are validated on the first chunk."""


class MapBatchesOperator(Operator):
    """``map_batches(fn, schema=None)``: ``fn(table) -> table`` on every chunk (Spark's
    ``mapInArrow``). ``schema`` is what ``fn`` returns; without it the steps after this one are
    checked at the first batch. ``fn`` runs in the engine's reader threads, so it must be
    thread-safe."""

    def __init__(self, fn: Callable[[pa.Table], Any], *, schema: pa.Schema | None = None, label: str = "map_batches") -> None:
        self.fn = fn
        self.schema = schema
        self.label = label

    @property
    def name(self) -> str:
        return self.label

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        # The function is never called on a probe table: it may have side effects (it is the
        # user's code), so without a declared schema what follows is checked at the first batch.
        if self.schema is not None:
            return self.schema
        raise SchemaUnknown(self.label)

    def input_columns(self, needed: frozenset[str] | None) -> frozenset[str] | None:
        """What ``fn.input_columns(needed)`` says, when ``fn`` has that method (e.g.
        :class:`~headrace.transforms.from_json.FromJson`); None (every column) otherwise."""
        ask = getattr(self.fn, "input_columns", None)
        return ask(needed) if callable(ask) else None

    def process(self, table: pa.Table, batch: BatchInfo) -> pa.Table | None:
        out = self.fn(table)
        if isinstance(out, pa.RecordBatch):
            return pa.Table.from_batches([out])
        if isinstance(out, pa.Table) or out is None:
            return out
        raise HeadraceError(f"the {self.label} function returned {type(out).__name__}; it must return a pyarrow.Table")


class FilterFunctionOperator(Operator):
    """``filter(fn)``: keeps the rows where ``fn(table)`` (a boolean Arrow array) is true.
    Runs in the reader threads, so ``fn`` must be thread-safe."""

    def __init__(self, predicate: Callable[[pa.Table], Any]) -> None:
        self.predicate = predicate

    @property
    def name(self) -> str:
        return "filter"

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        return input_schema

    def process(self, table: pa.Table, batch: BatchInfo) -> pa.Table | None:
        return table.filter(self.predicate(table))


class SqlOperator(Operator):
    """A SELECT over the table ``batch`` (``select_expr``, ``where``, ``with_column``, ``sql``).

    ``what`` names the step in errors, e.g. ``where('amount > 0')``. The query is parsed when
    the step is defined and run on an empty table of the input schema at ``start()``."""

    def __init__(self, query: str, *, what: str, check: bool = True, dialect: str | None = None) -> None:
        from headrace.transforms.spark_sql import SparkSql, current_sql_dialect, sql_dialect_name

        self.dialect = sql_dialect_name(dialect) if dialect is not None else current_sql_dialect()
        self.source = query
        self.spark: SparkSql | None = None
        if self.dialect == "spark" and check:  # translated at definition, again per input schema
            self.spark = SparkSql(query, what=what)
            query = self.spark.duckdb()
        self.query = query
        self.what = what
        if check:
            check_syntax(query, what=what)

    @property
    def name(self) -> str:
        return self.what

    def base_query(self, schema: pa.Schema) -> str:
        """The step's query (DuckDB's dialect) for an input of this schema, before the binary
        casts are applied: Spark SQL is translated with the input's column types known."""
        if self.spark is not None:
            return self.spark.duckdb(schema)
        return self.query

    def query_for(self, schema: pa.Schema) -> str:
        """The query to run on a table of this schema (cached for the last schema seen)."""
        cached = getattr(self, "_cached", None)
        if cached is not None and cached[0] == schema:
            return str(cached[1])
        query = spark_string_casts(self.base_query(schema), schema)
        self._cached = (schema, query)
        return query

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        """DuckDB plans the query over an empty table of ``input_schema`` (once per query and
        schema in the process: a query started again, e.g. a scheduled ``available_now`` run,
        does not ask DuckDB again)."""
        cached = getattr(self, "_out", None)
        if cached is not None and cached[0] == input_schema:
            return cached[1]
        query = self.query_for(input_schema)
        out = _remembered(_SCHEMAS, (query, input_schema))
        if out is None:
            out = run_sql(input_schema.empty_table(), query, what=self.what).schema
            _remember(_SCHEMAS, (query, input_schema), out)
        self._out = (input_schema, out)
        return out

    def fast_for(self, schema: pa.Schema) -> Callable[[pa.Table], pa.Table] | None:
        """The query compiled to Arrow compute for chunks of this schema, or None
        (``headrace.transforms.arrow_eval``); compiled once per schema."""
        cached = getattr(self, "_fast", None)
        if cached is not None and cached[0] == schema:
            return cached[1]
        from headrace.transforms.arrow_eval import compile_query

        query, out = self.query_for(schema), self.output_schema(schema)
        key = (query, schema, out)
        if key in _COMPILED:
            fast = _COMPILED[key]
        else:  # the compiled function is pure: shared by every run of the same query and schema
            fast = compile_query(query, schema, out)
            _remember(_COMPILED, key, fast)
        self._fast = (schema, fast)
        return fast

    def process(self, table: pa.Table, batch: BatchInfo) -> pa.Table | None:
        fast = self.fast_for(table.schema)
        if fast is not None:
            try:
                return fast(table)
            except Exception:  # e.g. an overflow: DuckDB runs the chunk and reports it
                pass
        return run_sql(table, self.query_for(table.schema), what=self.what)

    @staticmethod
    def fuse(steps: Sequence[tuple[SqlOperator, pa.Schema]]) -> SqlOperator:
        """Several steps (each with its input's schema) as one query: each step's result is
        the ``batch`` of the next one."""
        query = steps[0][0].query_for(steps[0][1])
        for op, schema in steps[1:]:
            query = f"WITH batch AS ({query}) SELECT * FROM ({op.query_for(schema)})"
        return _FusedSql(query, what=".".join(op.what for op, _ in steps), steps=steps)


class _FusedSql(SqlOperator):
    """Steps fused by the plan: their queries are final (casts already applied). On small
    chunks, the steps' compiled forms run one after the other when every step has one."""

    def __init__(self, query: str, *, what: str, steps: Sequence[tuple[SqlOperator, pa.Schema]]) -> None:
        super().__init__(query, what=what, check=False, dialect="duckdb")
        self.steps = list(steps)

    def query_for(self, schema: pa.Schema) -> str:
        return self.query

    def fast_for(self, schema: pa.Schema) -> Callable[[pa.Table], pa.Table] | None:
        cached = getattr(self, "_fast", None)
        if cached is not None and cached[0] == schema:
            return cached[1]
        fast = None
        if schema == self.steps[0][1]:
            fns = [op.fast_for(s) for op, s in self.steps]
            if all(f is not None for f in fns):
                chain = [f for f in fns if f is not None]

                def fast(table: pa.Table) -> pa.Table:
                    for f in chain:
                        table = f(table)
                    return table

        self._fast = (schema, fast)
        return fast


class WithColumnOperator(SqlOperator):
    """``with_column(name, expr)``: adds the column, or replaces it in place if it exists."""

    def __init__(self, name: str, expr: str, *, dialect: str | None = None) -> None:
        from headrace.transforms.spark_sql import SparkSql, current_sql_dialect, sql_dialect_name

        self.column = name
        self.expr = expr
        what = f"with_column({name!r}, {expr!r})"
        chosen = sql_dialect_name(dialect) if dialect is not None else current_sql_dialect()
        self.spark_expr = SparkSql(expr, what=what, kind="expression") if chosen == "spark" else None
        duck = self.spark_expr.duckdb() if self.spark_expr is not None else expr
        super().__init__(with_column_query(name, duck, False), what=what, dialect="duckdb")
        self.dialect = chosen

    def base_query(self, schema: pa.Schema) -> str:
        expr = self.spark_expr.duckdb(schema) if self.spark_expr is not None else self.expr
        return with_column_query(self.column, expr, self.column in schema.names)


class SelectColumnsOperator(Operator):
    """``select("a", "b")`` of plain column names: an Arrow projection, no SQL."""

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = list(columns)

    @property
    def name(self) -> str:
        return f"select({', '.join(map(repr, self.columns))})"

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        missing = [c for c in self.columns if c not in input_schema.names]
        if missing:
            raise ExpressionError(
                f"{self.name}: no column {', '.join(map(repr, missing))}; the columns are {input_schema.names}"
            )
        return pa.schema([input_schema.field(c) for c in self.columns])

    def input_columns(self, needed: frozenset[str] | None) -> frozenset[str] | None:
        return frozenset(self.columns)

    def process(self, table: pa.Table, batch: BatchInfo) -> pa.Table | None:
        return table.select(self.columns)


class RenameColumnOperator(Operator):
    """``with_column_renamed(old, new)``; a missing ``old`` is a no-op, as in Spark."""

    def __init__(self, old: str, new: str) -> None:
        self.old = old
        self.new = new

    @property
    def name(self) -> str:
        return f"with_column_renamed({self.old!r}, {self.new!r})"

    def _names(self, names: Sequence[str]) -> list[str]:
        return [self.new if n == self.old else n for n in names]

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        names = self._names(input_schema.names)
        if self.old in input_schema.names and self.new != self.old and self.new in input_schema.names:
            raise ExpressionError(
                f"{self.name}: a column {self.new!r} exists already; drop it first or choose another name"
            )
        return pa.schema([f.with_name(n) for f, n in zip(input_schema, names, strict=True)], metadata=input_schema.metadata)

    def input_columns(self, needed: frozenset[str] | None) -> frozenset[str] | None:
        if needed is None:
            return None
        # a needed ``new`` is ``old`` renamed, or ``new`` itself when there is no ``old`` (a no-op)
        return frozenset(needed) | {self.old} if self.new in needed else frozenset(needed)

    def process(self, table: pa.Table, batch: BatchInfo) -> pa.Table | None:
        if self.old not in table.column_names:
            return table
        return table.rename_columns(self._names(table.column_names))


class DropColumnsOperator(Operator):
    """``drop("a", "b")``; names that are not columns are ignored, as in Spark."""

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = list(columns)

    @property
    def name(self) -> str:
        return f"drop({', '.join(map(repr, self.columns))})"

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        drop = set(self.columns)
        return pa.schema([f for f in input_schema if f.name not in drop], metadata=input_schema.metadata)

    def input_columns(self, needed: frozenset[str] | None) -> frozenset[str] | None:
        return None if needed is None else needed - frozenset(self.columns)

    def process(self, table: pa.Table, batch: BatchInfo) -> pa.Table | None:
        present = [c for c in self.columns if c in table.column_names]
        return table.drop_columns(present) if present else table


def spark_string_casts(query: str, schema: pa.Schema) -> str:
    """Spark's ``CAST(binary_col AS STRING)`` decodes UTF-8; DuckDB's escapes every non-ASCII
    byte (``h\\xC3\\xA9llo``). So a cast of a binary column (Kafka's ``key``/``value``) to
    ``STRING``/``VARCHAR``/``TEXT`` becomes ``try(decode(col))``: UTF-8 text, NULL for bytes
    that are not UTF-8."""
    for f in schema:
        if not (pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type) or pa.types.is_binary_view(f.type)):
            continue
        name = re.escape(f.name)
        col = rf'(?:"{name}"|(?<![\w."]){name}(?![\w"]))'
        query = re.sub(rf"(?i)\bCAST\s*\(\s*({col})\s+AS\s+(?:STRING|VARCHAR|TEXT)\s*\)", r"try(decode(\1))", query)
        query = re.sub(rf"(?i)({col})\s*::\s*(?:STRING|VARCHAR|TEXT)\b", r"try(decode(\1))", query)
    return query


def select_expr_query(exprs: Sequence[str]) -> str:
    return "SELECT " + ", ".join(f"{e}" for e in exprs) + " FROM batch"


def where_query(condition: str) -> str:
    return f"SELECT * FROM batch WHERE ({condition})"


def with_column_query(name: str, expr: str, replace: bool) -> str:
    if replace:
        return f"SELECT * REPLACE (({expr}) AS {quote_ident(name)}) FROM batch"
    return f"SELECT *, ({expr}) AS {quote_ident(name)} FROM batch"
