"""SQL expressions over Arrow tables, evaluated by DuckDB (an optional dependency, imported
only when an expression is used: ``pip install 'headrace[sql]'``).

The table is visible to the SQL as ``batch``. DuckDB reads the Arrow data without copying it.
All threads share one in-memory DuckDB database (one pool of DuckDB worker threads); each
thread queries through its own cursor, as DuckDB requires. The session time zone is UTC, so
``TIMESTAMP WITH TIME ZONE`` values come back as Arrow ``timestamp[us, tz=UTC]``.

Small tables are read through a per-cursor *slot*: an object exposing the Arrow C stream
interface, registered once, whose table is swapped before each query (registering and
unregistering a table per query cost a third of a query over 100 rows). Large tables are
registered themselves, for DuckDB's parallel, column-pruned scans; a join's static side stays
registered while the same snapshot is used.
"""

from __future__ import annotations

import atexit
import logging
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
    "release_thread",
    "run_sql",
]

log = logging.getLogger(__name__)
_local = threading.local()
_db_lock = threading.Lock()
_db: Any = None
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CHECKED: set[str] = set()  # queries check_syntax passed (one SELECT each)


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


SMALL_TABLE_ROWS = 16_384  # up to this size a table is read through the thread's slot


class _Slot:
    """A name registered once in a cursor; DuckDB reads whatever table it holds at query time
    (through ``__arrow_c_stream__``, asked anew by each query)."""

    def __init__(self) -> None:
        self.table: pa.Table | None = None

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        if self.table is None:
            raise HeadraceError("no table is bound to this name")
        return self.table.__arrow_c_stream__(requested_schema)


def _bind(con: Any, name: str, table: pa.Table, *, keep: bool = False) -> _Slot | None:
    """Make ``name`` read ``table`` in this thread's cursor.

    A small table goes through the name's slot (registered once: a registration costs more
    than a query over a few rows). A large one is registered itself, so DuckDB scans it in
    parallel and reads only the columns the query needs (a stream is read whole, by one
    thread). ``keep``: leave a large table registered while the same object comes back (a
    join's static side), instead of registering it per query. Returns the slot used, if any."""
    regs: dict[str, Any] = _local.__dict__.setdefault("registered", {})
    current = regs.get(name)
    if table.num_rows > SMALL_TABLE_ROWS or (keep and current is table):
        if current is not table:
            con.register(name, table)
            regs[name] = table
        return None
    if isinstance(current, _Slot):
        current.table = table
        return current
    slot = _Slot()
    slot.table = table  # DuckDB reads the object's schema when it is registered
    con.register(name, slot)
    regs[name] = slot
    return slot


def _release(con: Any, name: str, slot: _Slot | None, *, keep: bool) -> None:
    """After a query: a slot holds no data; a large table is unregistered unless ``keep``."""
    if slot is not None:
        slot.table = None
        return
    if not keep:
        regs: dict[str, Any] = _local.__dict__.setdefault("registered", {})
        regs.pop(name, None)
        con.unregister(name)


def release_thread() -> None:
    """Close this thread's DuckDB cursor and drop what it has registered. Called by the engine
    when a query's thread ends, and at exit for the main thread: a cursor destroyed later, by a
    daemon thread's teardown racing the interpreter's shutdown, takes the GIL from inside
    DuckDB's C++ destructor and aborts the process ("FATAL: exception not rethrown")."""
    con = _local.__dict__.pop("con", None)
    regs: dict[str, Any] = _local.__dict__.pop("registered", {})
    if con is None:
        return
    for name in regs:
        try:
            con.unregister(name)
        except Exception as e:  # closing must not fail a query's end
            log.debug("unregistering %s failed: %s", name, e)
    try:
        con.close()
    except Exception as e:
        log.debug("closing a DuckDB cursor failed: %s", e)


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
        if threading.current_thread() is threading.main_thread():
            atexit.register(release_thread)
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
    if it is not one valid SELECT statement. Called when a transform is defined; a query that
    passed once in this process is not parsed again."""
    if query in _CHECKED:
        return
    _check_syntax(query, what=what)
    if len(_CHECKED) >= 1024:
        _CHECKED.clear()
    _CHECKED.add(query)


def _check_syntax(query: str, *, what: str) -> None:
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
    bound: list[tuple[str, _Slot | None, bool]] = []
    try:
        bound.append(("batch", _bind(con, "batch", table), False))
        for name, t in extra:
            bound.append((name, _bind(con, name, t, keep=True), True))
        try:
            return con.sql(query).to_arrow_table()
        finally:
            for name, slot, keep in bound:
                _release(con, name, slot, keep=keep)
    except HeadraceError:
        raise
    except Exception as e:
        raise ExpressionError(f"{what} failed on columns {table.column_names}: {_first_line(e)}") from None


def condition_mask(table: pa.Table, condition: str) -> pa.ChunkedArray:
    """A boolean array: the SQL ``condition`` evaluated on every row of ``table`` (NULL is
    false). E.g. ``condition_mask(t, "_change_type = 'delete'")``."""
    out = run_sql(table, f"SELECT coalesce(({condition}), false) AS m FROM batch", what=f"condition {condition!r}")
    return out.column("m")
