"""Named tables outside a pipeline: the local warehouse, the default :class:`~headrace.api.catalog.Catalog`.

``writeStream.toTable("events")``, ``readStream.table("events")`` and ``hr.read.table("events")``
resolve a name to a Delta table in a folder, as Spark's session catalog resolves it to a
managed table under ``spark.sql.warehouse.dir``:

- the warehouse folder is set once per process with :func:`set_warehouse`, else by the
  ``HEADRACE_WAREHOUSE`` environment variable, else it is ``spark-warehouse`` in the current
  directory (Spark's default);
- ``name`` and ``default.name`` live in ``<warehouse>/name``; ``db.name`` in
  ``<warehouse>/db.db/name`` (Spark's layout); a three-part ``catalog.db.name`` (Unity
  Catalog's names, as Databricks code writes them) in ``<warehouse>/catalog/db.db/name``, with
  ``spark_catalog.db.name`` the same as ``db.name``;
- each part is letters, digits and underscores (optionally in backticks) and is matched
  case-insensitively (stored lower-case), so no name reaches outside the warehouse;
- tables are Delta tables, written by the ``delta`` sink and read by the ``delta`` source, so
  they need headrace-delta; without it every call is refused, naming the package to install.

A pipeline installs its own catalog (its datasets) while it calls a definition; this one is
used everywhere else.
"""

from __future__ import annotations

import os
import re
import threading
from typing import TYPE_CHECKING, Any

from headrace.errors import HeadraceError

if TYPE_CHECKING:
    from headrace.api.frame import StreamFrame
    from headrace.api.reader import DataStreamReader
    from headrace.api.writer import DataStreamWriter

__all__ = ["DEFAULT_WAREHOUSE", "WAREHOUSE_ENV", "TableNameError", "WarehouseCatalog", "set_warehouse",
           "table_path", "warehouse_path"]  # fmt: skip

WAREHOUSE_ENV = "HEADRACE_WAREHOUSE"
DEFAULT_WAREHOUSE = "spark-warehouse"
_PART = re.compile(r"^[A-Za-z0-9_]+$")
_MAX_PART = 255
_lock = threading.Lock()
_configured: str | None = None


class TableNameError(HeadraceError):
    """A table name that is not ``name``, ``db.name`` or ``catalog.db.name`` of plain parts."""


def set_warehouse(path: str | os.PathLike[str] | None) -> str | None:
    """Set the folder named tables live in, for this process (``None``: back to the
    environment variable or the default); returns the previous setting. Called once, before
    the queries that use table names; thread-safe."""
    global _configured
    with _lock:
        previous = _configured
        _configured = None if path is None else os.path.abspath(os.fspath(path))
    return previous


def warehouse_path() -> str:
    """The warehouse folder now: :func:`set_warehouse`'s, else ``$HEADRACE_WAREHOUSE``, else
    ``./spark-warehouse`` (absolute, from the current directory)."""
    with _lock:
        configured = _configured
    if configured is not None:
        return configured
    return os.path.abspath(os.environ.get(WAREHOUSE_ENV) or DEFAULT_WAREHOUSE)


def _parts(name: Any) -> list[str]:
    if not isinstance(name, str) or not name.strip():
        raise TableNameError(f"a table name must be a non-empty string like 'events' or 'sales.events', not {name!r}")
    parts = name.strip().split(".")
    out = []
    for raw in parts:
        part = raw[1:-1] if len(raw) >= 2 and raw[0] == raw[-1] == "`" else raw
        if not _PART.match(part) or len(part) > _MAX_PART:
            raise TableNameError(
                f"table name {name!r}: part {raw!r} is not a plain identifier; use letters, digits and "
                f"underscores (at most {_MAX_PART}), parts separated by dots: 'events', 'sales.events' or "
                "'main.sales.events'"
            )
        out.append(part.lower())
    if len(out) > 3:
        raise TableNameError(f"table name {name!r} has {len(out)} parts; at most 3: catalog.database.table")
    return out


def table_path(name: str, warehouse: str | None = None) -> str:
    """The folder of table ``name`` in ``warehouse`` (default :func:`warehouse_path`); raises
    :class:`TableNameError` for a name that is not plain parts. Pure: no I/O."""
    parts = _parts(name)
    root = warehouse if warehouse is not None else warehouse_path()
    if len(parts) == 3 and parts[0] == "spark_catalog":
        parts = parts[1:]
    if len(parts) == 2 and parts[0] == "default":
        parts = parts[1:]
    *prefix, table = parts
    if prefix:
        *catalog, db = prefix
        return os.path.join(root, *catalog, f"{db}.db", table)
    return os.path.join(root, table)


def _tables_in(root: str) -> list[str]:
    """The names of the Delta tables in ``root`` (two levels of databases at most)."""
    found: list[str] = []
    if not os.path.isdir(root):
        return found
    for dirpath, dirnames, _files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        depth = 0 if rel == "." else rel.count(os.sep) + 1
        if "_delta_log" in dirnames:
            segments = [s[:-3] if s.endswith(".db") else s for s in rel.split(os.sep)]
            found.append(".".join(segments))
            dirnames[:] = []
        elif depth >= 3:
            dirnames[:] = []
        else:
            dirnames[:] = [d for d in dirnames if not d.startswith(("_", "."))]
    return sorted(found)


def _need_delta(what: str) -> None:
    from headrace.errors import ConnectorNotFoundError, PluginError
    from headrace.plugins import registry

    try:
        registry().get("delta")
    except (ConnectorNotFoundError, PluginError) as e:
        raise HeadraceError(
            f"{what}: named tables are Delta tables in the warehouse and need the delta connector ({e}); fix: "
            "pip install headrace-delta, or read and write by path with another format: "
            "read_stream.format('parquet').load(path) / write_stream.format('parquet').start(path)"
        ) from None


class WarehouseCatalog:
    """The :class:`~headrace.api.catalog.Catalog` of named tables in the warehouse folder.
    Stateless: every call resolves the warehouse and the name afresh."""

    def __init__(self, warehouse: str | None = None) -> None:
        self._warehouse = warehouse

    @property
    def warehouse(self) -> str:
        return self._warehouse if self._warehouse is not None else warehouse_path()

    def _existing(self, name: str, how: str) -> str:
        path = table_path(name, self.warehouse)
        _need_delta(f"{how}({name!r})")
        if not os.path.isdir(os.path.join(path, "_delta_log")):
            tables = _tables_in(self.warehouse)
            raise HeadraceError(
                f"{how}({name!r}): no table {name!r} in the warehouse {self.warehouse} (no Delta table at {path}; "
                f"tables there: {', '.join(tables) if tables else 'none'}); fix: write it first with "
                f"writeStream.toTable({name!r}), or point headrace at the warehouse holding it with "
                f"hr.set_warehouse(path) or ${WAREHOUSE_ENV}"
            )
        return path

    def stream_table(self, name: str, reader: DataStreamReader) -> StreamFrame:
        """``readStream.table(name)``: the table as a stream of the delta source; options set on
        the reader go to it. Called once per call, on the caller's thread."""
        how = "readStream.table"
        fmt = getattr(reader, "_format", None)
        if fmt not in (None, "delta"):
            raise HeadraceError(f"readStream.format({fmt!r}).table({name!r}): warehouse tables are Delta; drop format()")
        path = self._existing(name, how)
        return reader.format("delta").load(path)

    def static_frame(self, name: str) -> Any:
        """``read.table(name)``: the table as a lazy ``StaticFrame`` of its Delta table. Called
        once per call, on the caller's thread."""
        from headrace.api.static import read

        path = self._existing(name, "read.table")
        return read.format("delta").load(path)

    def table_writer(self, name: str, writer: DataStreamWriter) -> DataStreamWriter:
        """``writeStream.toTable(name)``: ``writer`` set to write the table with the delta sink
        (which creates it on its first batch). Called once per call, before the query starts."""
        fmt = getattr(writer, "_format", None)
        if fmt not in (None, "delta"):
            raise HeadraceError(f"writeStream.format({fmt!r}).toTable({name!r}): warehouse tables are Delta; "
                                "drop format() or write by path with start(path)")  # fmt: skip
        path = table_path(name, self.warehouse)
        _need_delta(f"writeStream.toTable({name!r})")
        return writer.format("delta").option("path", path)
