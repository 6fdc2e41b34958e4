"""The stateless methods shared by streams (``StreamFrame``) and static frames (``StaticFrame``).

Each method appends one operator to the frame's plan and returns a new frame (frames are
immutable). SQL is parsed at once; when the frame's schema is known (a static ``pyarrow.Table``,
or a stream read with ``.schema(...)``), every step is also checked against it at once, else at
``start()`` / ``to_arrow()``: either way before any data is read.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Self

import pyarrow as pa

from headrace.errors import HeadraceError
from headrace.transforms.operator import Operator

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

    def filter(self, condition: Callable[[pa.Table], Any] | str) -> Self:
        """Keep the rows where ``condition`` holds: a SQL condition (``"amount > 0"``, as
        :meth:`where`) or a function of the table returning a boolean Arrow array."""
        if isinstance(condition, str):
            return self.where(condition)
        if not callable(condition):
            raise HeadraceError(f"filter() takes a SQL condition (str) or a function; got {type(condition).__name__}")
        from headrace.transforms.stateless import FilterFunctionOperator

        return self._with_step(FilterFunctionOperator(condition))

    def where(self, condition: str) -> Self:
        """Keep the rows where the SQL ``condition`` is true (NULL counts as false), e.g.
        ``where("body IS NOT NULL AND amount > 0")``. Spark's ``where``/``filter``."""
        from headrace.transforms.stateless import SqlOperator, where_query

        return self._with_step(SqlOperator(where_query(condition), what=f"where({condition!r})"))

    def select_expr(self, *exprs: str) -> Self:
        """One output column per SQL expression, e.g.
        ``select_expr("CAST(key AS VARCHAR) AS user", "amount * 2 AS double")``. Spark's
        ``selectExpr``."""
        if not exprs:
            raise HeadraceError("select_expr() needs at least one expression, e.g. select_expr('*')")
        from headrace.transforms.stateless import SqlOperator, select_expr_query

        what = f"select_expr({', '.join(map(repr, exprs))})"
        return self._with_step(SqlOperator(select_expr_query(exprs), what=what))

    def select(self, *cols: str) -> Self:
        """Keep these columns, in this order (names, not expressions: see :meth:`select_expr`)."""
        if not cols:
            raise HeadraceError("select() needs at least one column name")
        if "*" in cols:
            from headrace.transforms.expressions import quote_ident

            return self.select_expr(*("*" if c == "*" else quote_ident(c) for c in cols))
        from headrace.transforms.stateless import SelectColumnsOperator

        return self._with_step(SelectColumnsOperator(cols))

    def with_column(self, name: str, expr: str) -> Self:
        """Add column ``name`` computed by the SQL ``expr`` (replacing it if it exists), e.g.
        ``with_column("amount", "CAST(json_extract_string(body, '$.amount') AS DOUBLE)")``."""
        from headrace.transforms.stateless import WithColumnOperator

        return self._with_step(WithColumnOperator(name, expr))

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
