"""PySpark's ``pyspark.sql.functions`` helpers that streaming code uses, as headrace values::

    from headrace import functions as F

    (hr.readStream.format("kafka")...load()
       .withColumn("event_key", F.expr("CAST(value AS STRING)"))
       .join(F.broadcast(lookup), F.expr("event_key = lookup_key"))
       .withWatermark("timestamp", "10 minutes")
       .groupBy(F.window(F.col("timestamp"), "1 minute"), F.col("event_key"))
       .agg(F.count("*").alias("n"), F.sum("amount").alias("total")))

A :class:`Column` is a SQL expression (the same text the string forms take), so a frame built
with these helpers has exactly the plan of the one built with strings: ``where(F.col("n") > 5)``
is ``where("n > 5")``, ``agg(F.count("*").alias("n"))`` is ``agg("count(*) AS n")``,
``F.window(F.col("ts"), "1 minute")`` is ``hr.window("ts", "1 minute")``. The frame methods
(``select``, ``select_expr``, ``where``/``filter``, ``with_column``, ``group_by``, ``agg``,
``join``'s ``on``) accept a :class:`Column` wherever they accept a string.

Every helper is pure and cheap: called at definition time, on the caller's thread, no I/O.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from headrace.errors import HeadraceError

__all__ = [
    "Column",
    "avg",
    "broadcast",
    "col",
    "column",
    "count",
    "expr",
    "from_json",
    "lit",
    "max",
    "mean",
    "min",
    "session_window",
    "sql_of",
    "sum",
    "window",
]

log = logging.getLogger(__name__)


def _ident(name: str) -> str:
    from headrace.transforms.expressions import is_identifier, quote_ident

    return name if is_identifier(name) else quote_ident(name)


@dataclass(frozen=True)
class Column:
    """A SQL expression over a frame's columns. ``column_name`` is set for a bare column
    (``col("x")``), so it can stand where a column name is wanted (``group_by``, ``window``)."""

    sql: str
    column_name: str | None = None
    compound: bool = False  # needs parentheses as an operand

    def __str__(self) -> str:
        return self.sql

    def __repr__(self) -> str:
        return f"Column<{self.sql!r}>"

    def __bool__(self) -> bool:
        raise HeadraceError(
            f"a Column ({self.sql}) has no truth value: combine conditions with & | ~, not and / or / not"
        )

    __hash__ = object.__hash__

    # naming
    def alias(self, name: str) -> Column:
        """The expression named ``name`` (``count("*").alias("n")`` is ``count(*) AS n``)."""
        return Column(f"{self._operand()} AS {_ident(name)}")

    name = alias

    def cast(self, to: str) -> Column:
        """``CAST(expr AS to)``; ``to`` is a SQL type name (``"DOUBLE"``, ``"STRING"``)."""
        return Column(f"CAST({self.sql} AS {to})")

    astype = cast

    def isNull(self) -> Column:
        return Column(f"{self._operand()} IS NULL", compound=True)

    def isNotNull(self) -> Column:
        return Column(f"{self._operand()} IS NOT NULL", compound=True)

    is_null = isNull
    is_not_null = isNotNull

    # operators
    def _operand(self) -> str:
        return f"({self.sql})" if self.compound else self.sql

    def _binary(self, op: str, other: Any, *, reverse: bool = False) -> Column:
        left, right = self._operand(), _operand(other)
        if reverse:
            left, right = right, left
        return Column(f"{left} {op} {right}", compound=True)

    def __eq__(self, other: Any) -> Column:  # type: ignore[override]
        return self._binary("=", other)

    def __ne__(self, other: Any) -> Column:  # type: ignore[override]
        return self._binary("<>", other)

    def __lt__(self, other: Any) -> Column:
        return self._binary("<", other)

    def __le__(self, other: Any) -> Column:
        return self._binary("<=", other)

    def __gt__(self, other: Any) -> Column:
        return self._binary(">", other)

    def __ge__(self, other: Any) -> Column:
        return self._binary(">=", other)

    def __add__(self, other: Any) -> Column:
        return self._binary("+", other)

    def __radd__(self, other: Any) -> Column:
        return self._binary("+", other, reverse=True)

    def __sub__(self, other: Any) -> Column:
        return self._binary("-", other)

    def __rsub__(self, other: Any) -> Column:
        return self._binary("-", other, reverse=True)

    def __mul__(self, other: Any) -> Column:
        return self._binary("*", other)

    def __rmul__(self, other: Any) -> Column:
        return self._binary("*", other, reverse=True)

    def __truediv__(self, other: Any) -> Column:
        return self._binary("/", other)

    def __rtruediv__(self, other: Any) -> Column:
        return self._binary("/", other, reverse=True)

    def __mod__(self, other: Any) -> Column:
        return self._binary("%", other)

    def __and__(self, other: Any) -> Column:
        return self._binary("AND", other)

    def __or__(self, other: Any) -> Column:
        return self._binary("OR", other)

    def __invert__(self) -> Column:
        return Column(f"NOT {self._operand()}", compound=True)

    def __neg__(self) -> Column:
        return Column(f"-{self._operand()}", compound=True)


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    raise HeadraceError(f"lit({value!r}): a literal is None, a bool, a number or a string, not {type(value).__name__}")


def _operand(value: Any) -> str:
    return value._operand() if isinstance(value, Column) else _literal(value)


def _column_arg(value: Column | str, what: str) -> str:
    """A function's argument: a Column's SQL, or a column name (PySpark's convention)."""
    if isinstance(value, Column):
        return value.sql
    if isinstance(value, str):
        return "*" if value == "*" else _ident(value)
    raise HeadraceError(f"{what}() takes a column name or a Column, not {type(value).__name__}")


def sql_of(value: Any, what: str) -> str:
    """The SQL text of a frame method's argument: a string as it is, a :class:`Column` as its
    expression. Raises naming ``what`` for anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, Column):
        return value.sql
    raise HeadraceError(f"{what} takes SQL text or a headrace.functions Column, not {type(value).__name__}")


def name_of(value: Any, what: str) -> str:
    """A column name from a string or a bare-column :class:`Column` (``col("ts")``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Column) and value.column_name is not None:
        return value.column_name
    raise HeadraceError(f"{what} takes a column name or col(name), not {value!r}")


def col(name: str) -> Column:
    """The column ``name`` (``col("amount") > 0`` is ``amount > 0``)."""
    if not isinstance(name, str) or not name:
        raise HeadraceError(f"col() takes a column name, not {name!r}")
    return Column(_ident(name), column_name=name)


column = col


def expr(sql: str) -> Column:
    """A SQL expression as a Column (``expr("CAST(value AS STRING)")``)."""
    if not isinstance(sql, str) or not sql.strip():
        raise HeadraceError(f"expr() takes SQL text, not {sql!r}")
    return Column(sql, compound=True)


def lit(value: Any) -> Column:
    """A literal: None, a bool, a number or a string (quoted)."""
    return Column(_literal(value))


def _aggregate(fn: str, value: Column | str) -> Column:
    return Column(f"{fn}({_column_arg(value, fn)})")


def count(value: Column | str) -> Column:
    """``count(*)`` (``count("*")``), or the non-null values of a column."""
    return _aggregate("count", value)


def sum(value: Column | str) -> Column:
    return _aggregate("sum", value)


def avg(value: Column | str) -> Column:
    return _aggregate("avg", value)


def mean(value: Column | str) -> Column:
    return _aggregate("mean", value)


def min(value: Column | str) -> Column:
    return _aggregate("min", value)


def max(value: Column | str) -> Column:
    return _aggregate("max", value)


def window(time_column: Column | str, window_duration: str, slide_duration: str | None = None,
           start_time: str | None = None) -> Any:  # fmt: skip
    """Spark's ``window(col, "1 minute"[, slide][, startTime])``: :func:`headrace.window`."""
    from headrace.transforms.window import window as make

    return make(name_of(time_column, "window()"), window_duration, slide_duration, start_time)


def session_window(time_column: Column | str, gap_duration: str) -> Any:
    """Spark's ``session_window(col, "5 minutes")``: :func:`headrace.session_window`."""
    from headrace.transforms.window import session_window as make

    return make(name_of(time_column, "session_window()"), gap_duration)


def broadcast(frame: Any) -> Any:
    """Spark's broadcast hint: the frame itself (a stream-static join always broadcasts the
    static side: it is read once at start and probed by every micro-batch)."""
    return frame


def _duckdb_json_type(t: pa.DataType) -> Any:
    if pa.types.is_struct(t):
        return {f.name: _duckdb_json_type(f.type) for f in t}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [_duckdb_json_type(t.value_type)]
    names = {
        pa.bool_(): "BOOLEAN", pa.int8(): "TINYINT", pa.int16(): "SMALLINT", pa.int32(): "INTEGER",
        pa.int64(): "BIGINT", pa.float32(): "FLOAT", pa.float64(): "DOUBLE", pa.string(): "VARCHAR",
        pa.large_string(): "VARCHAR", pa.date32(): "DATE", pa.binary(): "BLOB",
    }  # fmt: skip
    if t in names:
        return names[t]
    if pa.types.is_timestamp(t):
        return "TIMESTAMPTZ" if t.tz else "TIMESTAMP"
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision}, {t.scale})"
    raise HeadraceError(f"from_json(): the schema's type {t} has no JSON reading; use a number, string, "
                        "boolean, date, timestamp, decimal, struct or array type")  # fmt: skip


def from_json(value: Column | str, schema: str | pa.Schema) -> Column:
    """Spark's ``from_json(col, "a BIGINT, b STRING")``: the JSON text parsed into a struct of
    that schema (a DDL string or a ``pyarrow.Schema``), as the SQL ``from_json(col,
    '{"a": "BIGINT", "b": "VARCHAR"}')`` (DuckDB's form, with the schema as JSON)."""
    from headrace.sql_types import parse_schema

    try:
        parsed = parse_schema(schema)
    except (ValueError, HeadraceError) as e:
        raise HeadraceError(f"from_json(): the schema {schema!r} is not a DDL schema ({e}); "
                            "give one like 'a BIGINT, b STRING'") from None  # fmt: skip
    structure = json.dumps({f.name: _duckdb_json_type(f.type) for f in parsed}, separators=(",", ":"))
    return Column(f"from_json({_column_arg(value, 'from_json')}, {_literal(structure)})")
