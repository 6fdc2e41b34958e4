"""SQL expressions over Arrow tables, evaluated by DuckDB (an optional dependency, imported
only when an expression is used: ``pip install 'headrace[sql]'``).

The table is visible to the SQL as ``batch``. DuckDB reads the Arrow data without copying it.
"""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa

from headrace.errors import HeadraceError

__all__ = ["ExpressionError", "condition_mask", "duckdb_connection", "run_sql"]

_local = threading.local()


class ExpressionError(HeadraceError):
    """A SQL expression that does not parse or does not fit the data (unknown column, bad type)."""


def duckdb_connection() -> Any:
    """This thread's DuckDB connection (an in-memory database, one per thread: a DuckDB
    connection must not be shared by threads running queries at once)."""
    con = getattr(_local, "con", None)
    if con is None:
        try:
            import duckdb
        except ImportError:
            raise HeadraceError(
                "SQL expressions need DuckDB, which is not installed; pip install 'headrace[sql]'"
            ) from None
        con = duckdb.connect(":memory:")
        _local.con = con
    return con


def run_sql(table: pa.Table, query: str, *, what: str = "SQL") -> pa.Table:
    """``query`` (a SELECT over the table ``batch``) run on ``table``; the result as Arrow."""
    con = duckdb_connection()
    try:
        con.register("batch", table)
        try:
            return con.sql(query).to_arrow_table()
        finally:
            con.unregister("batch")
    except HeadraceError:
        raise
    except Exception as e:
        raise ExpressionError(f"{what} {query!r} failed on columns {table.column_names}: {e}") from None


def condition_mask(table: pa.Table, condition: str) -> pa.ChunkedArray:
    """A boolean array: the SQL ``condition`` evaluated on every row of ``table`` (NULL is
    false). E.g. ``condition_mask(t, "_change_type = 'delete'")``."""
    out = run_sql(table, f"SELECT coalesce(({condition}), false) AS m FROM batch", what="condition")
    return out.column("m")
