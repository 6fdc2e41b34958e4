"""SQL expressions over Arrow tables, evaluated by DuckDB (an optional dependency, imported
only when an expression is used: ``pip install 'headrace[sql]'``).

The table is visible to the SQL as ``batch``. DuckDB reads the Arrow data without copying it.
All threads share one in-memory DuckDB database (one pool of DuckDB worker threads); each
thread queries through its own cursor, as DuckDB requires. The session time zone is UTC, so
``TIMESTAMP WITH TIME ZONE`` values come back as Arrow ``timestamp[us, tz=UTC]``.

Each cursor registers ``batch`` (and the other names a query needs, e.g. a join's ``static``)
once, as an object exposing the Arrow C stream interface whose table is swapped before each
query: registering and unregistering a table per query cost more than the query itself on
small chunks (~1.7 of ~5 ms for 100 rows).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from headrace.errors import HeadraceError

__all__ = [
    "ExpressionError",
    "check_syntax",
    "condition_mask",
    "duckdb_connection",
    "empty_table",
    "is_identifier",
    "quote_ident",
    "run_sql",
]

_local = threading.local()
_db_lock = threading.Lock()
_db: Any = None
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ExpressionError(HeadraceError):
    """A SQL expression that does not parse or does not fit the data (unknown column, bad type)."""


def _duckdb() -> Any:
    try:
        import duckdb
    except ImportError:
        raise HeadraceError(
            "SQL expressions need DuckDB, which is not installed; pip install 'headrace[sql]'"
        ) from None
    return duckdb


class _Slot:
    """A name registered once in a cursor; DuckDB reads whatever table it holds at query time
    (through ``__arrow_c_stream__``, asked anew by each query)."""

    def __init__(self) -> None:
        self.table: pa.Table | None = None

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        if self.table is None:
            raise HeadraceError("no table is bound to this name")
        return self.table.__arrow_c_stream__(requested_schema)


def _bind(con: Any, name: str, table: pa.Table) -> _Slot:
    """This thread's slot ``name``, holding ``table`` (registered at first use: DuckDB reads
    the object's schema when it is registered)."""
    slots: dict[str, _Slot] = _local.__dict__.setdefault("slots", {})
    slot = slots.get(name)
    if slot is None:
        slot = _Slot()
        slot.table = table
        con.register(name, slot)
        slots[name] = slot
    slot.table = table
    return slot


def duckdb_connection() -> Any:
    """This thread's DuckDB cursor on the shared in-memory database (a DuckDB connection must
    not run queries from several threads at once, so each thread gets its own cursor)."""
    con = getattr(_local, "con", None)
    if con is None:
        global _db
        with _db_lock:
            if _db is None:
                duckdb = _duckdb()
                db = duckdb.connect(":memory:")
                db.execute("SET GLOBAL TimeZone = 'UTC'")
                _db = db
        con = _db.cursor()
        _local.con = con
    return con


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier (``"my col"``; embedded quotes doubled)."""
    return '"' + str(name).replace('"', '""') + '"'


def is_identifier(text: str) -> bool:
    """Whether ``text`` is a plain column name (letters, digits, underscores)."""
    return bool(_IDENT.fullmatch(text))


def empty_table(schema: pa.Schema) -> pa.Table:
    """A table with no rows and ``schema`` (used to validate SQL before any data is read)."""
    return schema.empty_table()


def check_syntax(query: str, *, what: str) -> None:
    """Parse ``query`` (no data, no schema needed); raise ``ExpressionError`` naming ``what``
    if it is not one valid SELECT statement. Called when a transform is defined."""
    duckdb = _duckdb()
    try:
        statements = duckdb.extract_statements(query)
    except Exception as e:
        raise ExpressionError(f"{what} is not valid SQL: {_first_line(e)}") from None
    if len(statements) != 1:
        raise ExpressionError(f"{what} must be exactly one SELECT statement; found {len(statements)}")
    kind = str(getattr(statements[0], "type", "")).rsplit(".", 1)[-1]
    if kind and kind != "SELECT":
        raise ExpressionError(f"{what} must be a SELECT (a query over the table `batch`); it is a {kind} statement")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def run_sql(table: pa.Table, query: str, *, what: str = "SQL", extra: Iterable[tuple[str, Any]] = ()) -> pa.Table:
    """``query`` (a SELECT over the table ``batch``) run on ``table``; the result as Arrow.

    ``extra`` registers more tables under other names (e.g. a join's static side). Called per
    chunk by SQL operators, on whatever thread processes the chunk."""
    con = duckdb_connection()
    slots: list[_Slot] = []
    try:
        slots.append(_bind(con, "batch", table))
        for name, t in extra:
            slots.append(_bind(con, name, t))
        try:
            return con.sql(query).to_arrow_table()
        finally:
            for slot in slots:
                slot.table = None  # hold no data between queries
    except HeadraceError:
        raise
    except Exception as e:
        raise ExpressionError(f"{what} failed on columns {table.column_names}: {_first_line(e)}") from None


def condition_mask(table: pa.Table, condition: str) -> pa.ChunkedArray:
    """A boolean array: the SQL ``condition`` evaluated on every row of ``table`` (NULL is
    false). E.g. ``condition_mask(t, "_change_type = 'delete'")``."""
    out = run_sql(table, f"SELECT coalesce(({condition}), false) AS m FROM batch", what=f"condition {condition!r}")
    return out.column("m")
