"""The catalog seam: how the api resolves a table *name* without knowing who owns the tables.

``hr.read_stream.table(name)`` and ``hr.read.table(name)`` ask the :class:`Catalog` installed in
the current context (a :class:`~contextvars.ContextVar`, so threads and asyncio tasks each see
their own); outside one there is no catalog and they raise, naming the path-based read instead.
The declarative pipelines runner (and its dry run) installs its resolver with :func:`installed`
while it calls a definition, which is also how the pipeline's graph learns its edges: the shape
of Spark's ``graph_element_registry``. The api never imports the pipelines package.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from headrace.api.reader import DataStreamReader
    from headrace.api.stream_frame import StreamFrame

__all__ = ["Catalog", "active_catalog", "installed"]


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


_catalog: ContextVar[Catalog | None] = ContextVar("headrace_catalog", default=None)


def active_catalog() -> Catalog | None:
    """The catalog installed in this context, or None. Called by the readers' ``table``."""
    return _catalog.get()


@contextlib.contextmanager
def installed(catalog: Catalog) -> Iterator[Catalog]:
    """Install ``catalog`` for the ``with`` block (restoring the previous one after). Called by
    the catalog's owner (the pipelines runner) around each definition it calls."""
    token = _catalog.set(catalog)
    try:
        yield catalog
    finally:
        _catalog.reset(token)
