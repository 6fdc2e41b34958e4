"""The stateless methods shared by streams (``StreamFrame``) and static frames (``StaticFrame``).

Each method appends one operator to the frame's plan and returns a new frame (frames are
immutable). SQL is parsed at once; when the frame's schema is known (a static ``pyarrow.Table``,
or a stream read with ``.schema(...)``), every step is also checked against it at once, else at
``start()`` / ``to_arrow()``: either way before any data is read.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Self

import pyarrow as pa

from headrace.errors import HeadraceError
from headrace.transforms.operator import Operator

if TYPE_CHECKING:
    from headrace.functions import Column

__all__ = ["FrameSteps"]


class FrameSteps(ABC):
    """Mixin: a frame with a tuple of operators ``_steps`` and an optional known ``_schema``."""

    _steps: tuple[Operator, ...]
    _schema: pa.Schema | None

    @abstractmethod
    def _with_step(self, op: Operator) -> Self:
        """A copy of this frame with ``op`` appended (checked when the schema is known)."""

    @staticmethod
    def _next_schema(schema: pa.Schema | None, op: Operator) -> pa.Schema | None:
        """The schema after ``op`` (raising on a bad expression), or None if unknown."""
        if schema is None:
            return None
        from headrace.transforms.stateless import SchemaUnknown

        try:
            return op.output_schema(schema)
        except SchemaUnknown:
            return None

    def map_batches(self, fn: Callable[[pa.Table], pa.Table], schema: pa.Schema | None = None) -> Self:
        """Apply ``fn`` to every record batch (as a ``pyarrow.Table``); it returns a Table.

        Runs in the reading threads, so it must be thread-safe. Like Spark's ``mapInArrow``.
        ``schema`` (optional) is the schema ``fn`` returns: give it so the steps after this one
        are checked at ``start()`` and the sink knows the output schema; without it they are
        checked at the first batch (``fn`` is never called on a probe table)."""
        from headrace.transforms.stateless import MapBatchesOperator

        return self._with_step(MapBatchesOperator(fn, schema=schema))

    def filter(self, condition: Callable[[pa.Table], Any] | str | Column) -> Self:
        """Keep the rows where ``condition`` holds: a SQL condition (``"amount > 0"`` or
        ``col("amount") > 0``, as :meth:`where`) or a function of the table returning a boolean
        Arrow array."""
        from headrace.functions import Column

        if isinstance(condition, str | Column):
            return self.where(condition)
        if not callable(condition):
            raise HeadraceError(f"filter() takes a SQL condition (str) or a function; got {type(condition).__name__}")
        from headrace.transforms.stateless import FilterFunctionOperator

        return self._with_step(FilterFunctionOperator(condition))

    def where(self, condition: str | Column) -> Self:
        """Keep the rows where the SQL ``condition`` is true (NULL counts as false), e.g.
        ``where("body IS NOT NULL AND amount > 0")``. Spark's ``where``/``filter``."""
        from headrace.functions import sql_of
        from headrace.transforms.stateless import SqlOperator, where_query

        condition = sql_of(condition, "where()")
        return self._with_step(SqlOperator(where_query(condition), what=f"where({condition!r})"))

    def select_expr(self, *exprs: str | Column) -> Self:
        """One output column per SQL expression, e.g.
        ``select_expr("CAST(key AS VARCHAR) AS user", "amount * 2 AS double")``. Spark's
        ``selectExpr``."""
        if not exprs:
            raise HeadraceError("select_expr() needs at least one expression, e.g. select_expr('*')")
        from headrace.functions import sql_of
        from headrace.transforms.stateless import SqlOperator, select_expr_query

        texts = tuple(sql_of(e, "select_expr()") for e in exprs)
        what = f"select_expr({', '.join(map(repr, texts))})"
        return self._with_step(SqlOperator(select_expr_query(texts), what=what))

    def select(self, *cols: str | Column) -> Self:
        """Keep these columns, in this order (names, not expressions: see :meth:`select_expr`).
        PySpark's Columns work too: ``col("a")`` is the name ``a``; any other Column
        (``expr("x * 2 AS y")``, ``col("x").alias("y")``) makes the step a :meth:`select_expr`."""
        if not cols:
            raise HeadraceError("select() needs at least one column name")
        from headrace.functions import Column

        if any(isinstance(c, Column) and c.column_name is None for c in cols):
            from headrace.transforms.expressions import quote_ident

            return self.select_expr(*(c if isinstance(c, Column) else "*" if c == "*" else quote_ident(c)
                                      for c in cols))  # fmt: skip
        names = tuple(c.column_name or c.sql if isinstance(c, Column) else str(c) for c in cols)
        return self._select_names(names)

    def _select_names(self, cols: tuple[str, ...]) -> Self:
        if "*" in cols:
            from headrace.transforms.expressions import quote_ident

            return self.select_expr(*("*" if c == "*" else quote_ident(c) for c in cols))
        from headrace.transforms.stateless import SelectColumnsOperator

        return self._with_step(SelectColumnsOperator(cols))

    def with_column(self, name: str, expr: str | Column) -> Self:
        """Add column ``name`` computed by the SQL ``expr`` (replacing it if it exists), e.g.
        ``with_column("amount", "CAST(json_extract_string(body, '$.amount') AS DOUBLE)")``."""
        from headrace.functions import sql_of
        from headrace.transforms.stateless import WithColumnOperator

        return self._with_step(WithColumnOperator(name, sql_of(expr, f"with_column({name!r}, ...)")))

    def with_column_renamed(self, existing: str, new: str) -> Self:
        """Rename a column (a missing one is ignored, as in Spark)."""
        from headrace.transforms.stateless import RenameColumnOperator

        return self._with_step(RenameColumnOperator(existing, new))

    def drop(self, *cols: str) -> Self:
        """Remove these columns (names that are not columns are ignored, as in Spark)."""
        from headrace.transforms.stateless import DropColumnsOperator

        return self._with_step(DropColumnsOperator(cols))

    def sql(self, query: str) -> Self:
        """Any SELECT over the table ``batch`` (each micro-batch), in DuckDB's dialect, e.g.
        ``sql("SELECT user, amount * 2 AS double_amount FROM batch")``."""
        from headrace.transforms.stateless import SqlOperator

        return self._with_step(SqlOperator(query, what=f"sql({query!r})"))

    # PySpark's spellings (``df.selectExpr(...)`` runs as written)
    def selectExpr(self, *exprs: str | Column) -> Self:
        """PySpark's name of :meth:`select_expr`."""
        return self.select_expr(*exprs)

    def withColumn(self, name: str, expr: str | Column) -> Self:
        """PySpark's name of :meth:`with_column`."""
        return self.with_column(name, expr)

    def withColumnRenamed(self, existing: str, new: str) -> Self:
        """PySpark's name of :meth:`with_column_renamed`."""
        return self.with_column_renamed(existing, new)

    def mapInArrow(self, fn: Callable[[Iterator[pa.RecordBatch]], Iterable[pa.RecordBatch]],
                   schema: pa.Schema | str) -> Self:  # fmt: skip
        """PySpark's ``mapInArrow(fn, schema)``: ``fn`` takes an iterator of record batches and
        yields record batches of ``schema`` (a ``pyarrow.Schema`` or a DDL string); run as
        :meth:`map_batches` over each record batch, on the reading threads."""
        from headrace.sql_types import parse_schema

        out = parse_schema(schema)

        def apply(table: pa.Table) -> pa.Table:
            batches = list(fn(iter(table.to_batches())))
            return pa.Table.from_batches(batches, schema=out) if batches else out.empty_table()

        return self.map_batches(apply, schema=out)
