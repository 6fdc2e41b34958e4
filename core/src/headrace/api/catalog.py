"""The catalog seam: how the api resolves a table *name* without knowing who owns the tables.

``hr.read_stream.table(name)``, ``hr.read.table(name)`` and ``write_stream.to_table(name)`` ask
:func:`current_catalog`: the :class:`Catalog` installed in the current context (a
:class:`~contextvars.ContextVar`, so threads and asyncio tasks each see their own), else the
local warehouse (:class:`~headrace.api.warehouse.WarehouseCatalog`: Delta tables in a folder).
The declarative pipelines runner (and its dry run) installs its resolver with :func:`installed`
while it calls a definition, which is also how the pipeline's graph learns its edges: the shape
of Spark's ``graph_element_registry``. A catalog that tables can be written to by name is a
:class:`WritableCatalog`. The api never imports the pipelines package.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from headrace.api.reader import DataStreamReader
    from headrace.api.stream_frame import StreamFrame
    from headrace.api.writer import DataStreamWriter

__all__ = ["Catalog", "WritableCatalog", "active_catalog", "current_catalog", "installed"]


@runtime_checkable
class Catalog(Protocol):
    """Tables by name, for the definitions a catalog owner calls."""

    def stream_table(self, name: str, reader: DataStreamReader) -> StreamFrame:
        """The table ``name`` as a stream, read with ``reader``'s options. Called by
        ``read_stream.table(name)``, once per call, on the thread calling the definition."""
        ...

    def static_frame(self, name: str) -> Any:
        """The table ``name`` as a lazy static frame (a ``StaticFrame``). Called by
        ``read.table(name)``, once per call, on the thread calling the definition."""
        ...


@runtime_checkable
class WritableCatalog(Catalog, Protocol):
    """A catalog whose tables streaming queries write by name."""

    def table_writer(self, name: str, writer: DataStreamWriter) -> DataStreamWriter:
        """``writer`` set up to write table ``name`` (its format and location), for
        ``write_stream.to_table(name)`` to start. Called once per call, on the caller's thread,
        before the query starts; raises when the name or the writer's format does not fit."""
        ...


_catalog: ContextVar[Catalog | None] = ContextVar("headrace_catalog", default=None)


def active_catalog() -> Catalog | None:
    """The catalog installed in this context, or None (outside a pipeline's definition)."""
    return _catalog.get()


def current_catalog() -> Catalog:
    """The catalog table names resolve in: the one installed in this context, else the local
    warehouse. Called by ``read_stream.table``, ``read.table`` and ``write_stream.to_table``."""
    catalog = _catalog.get()
    if catalog is not None:
        return catalog
    from headrace.api.warehouse import WarehouseCatalog

    return WarehouseCatalog()


@contextlib.contextmanager
def installed(catalog: Catalog) -> Iterator[Catalog]:
    """Install ``catalog`` for the ``with`` block (restoring the previous one after). Called by
    the catalog's owner (the pipelines runner) around each definition it calls."""
    token = _catalog.set(catalog)
    try:
        yield catalog
    finally:
        _catalog.reset(token)
