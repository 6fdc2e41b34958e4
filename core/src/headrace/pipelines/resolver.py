"""Resolving dataset names while a definition runs: ``hr.read_stream.table(name)`` and
``dp.read.table(name)`` become reads of the pipeline's Delta tables (or inlined temporary
views), and every name read is recorded: these are the graph's edges.

The dry run calls definitions with ``analysis=True``: streams are built (their options
validated) but never started, and batch reads raise ``NeedsData`` if forced.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from headrace.api.static import StaticFrame
from headrace.errors import HeadraceError
from headrace.pipelines._context import resolving
from headrace.pipelines.batch_reads import needs_data
from headrace.pipelines.elements import MATERIALIZED_VIEW, SINK, TEMPORARY_VIEW, Dataset, Flow

if TYPE_CHECKING:
    from headrace.pipelines.graph import DataflowGraph

__all__ = ["Resolver", "UnknownDataset"]

STREAM, STATIC = "stream", "static"


class UnknownDataset(HeadraceError):
    """A definition read a name that is no dataset of the pipeline."""


class Resolver:
    """Resolves names for one call of one definition, and records what it read."""

    def __init__(self, graph: DataflowGraph, *, analysis: bool) -> None:
        self.graph = graph
        self.analysis = analysis
        self.reads: dict[str, set[str]] = {}
        self._stack: list[str] = []

    def resolve_path(self, path: str) -> str:
        if "://" in path or os.path.isabs(path):
            return path
        return os.path.normpath(os.path.join(self.graph.base_dir, path))

    def _lookup(self, name: str, how: str) -> Dataset:
        if not isinstance(name, str) or not name:
            raise HeadraceError(f"a table name must be a non-empty string, not {name!r}")
        ds = self.graph.lookup(name)
        if ds is None:
            known = ", ".join(sorted(d.name for d in self.graph.registry.datasets.values())) or "none"
            raise UnknownDataset(
                f"{how}({name!r}): no dataset {name!r} in the pipeline (datasets: {known}); define it with "
                "@dp.table / @dp.materialized_view / @dp.temporary_view / a SQL CREATE, write it to the local "
                "warehouse (writeStream.toTable(name)), or read files with a format"
            )
        self.reads.setdefault(ds.name, set()).add(STREAM if how.endswith("read_stream.table") else STATIC)
        return ds

    def _call_view(self, ds: Dataset) -> Any:
        if ds.name in self._stack:
            raise HeadraceError(f"temporary views read each other in a cycle: {' -> '.join([*self._stack, ds.name])}")
        flow = self.graph.flow_of(ds.name)
        assert flow is not None and flow.func is not None
        self._stack.append(ds.name)
        try:
            return flow.func()
        finally:
            self._stack.pop()

    def _external(self, name: str) -> Any:
        """The local warehouse when it holds a Delta table ``name`` (a table no pipeline owns,
        as a Databricks pipeline reads a catalog's table), else None."""
        from headrace.api.warehouse import TableNameError, WarehouseCatalog, table_path

        try:
            path = table_path(name)
        except TableNameError:
            return None
        return WarehouseCatalog() if os.path.isdir(os.path.join(path, "_delta_log")) else None

    def stream_table(self, name: str, reader: Any) -> Any:
        """``hr.read_stream.table(name)``: the dataset as a stream (a Delta source over its table,
        or the temporary view's stream). Reader options go to the delta source. A name that is
        no dataset of the pipeline reads the local warehouse's table of that name, if any."""
        try:
            ds = self._lookup(name, "hr.read_stream.table")
        except UnknownDataset:
            external = self._external(name)
            if external is None:
                raise
            return external.stream_table(name, reader)
        kind = self.graph.kind_of(ds)
        if kind == TEMPORARY_VIEW:
            out = self._call_view(ds)
            if not _is_stream(out):
                raise HeadraceError(
                    f"hr.read_stream.table({name!r}): temporary view {ds.name!r} is a batch query; "
                    "read it with dp.read.table(...) or make the view return hr.read_stream..."
                )
            return out
        if kind == MATERIALIZED_VIEW:
            raise HeadraceError(
                f"hr.read_stream.table({name!r}): {ds.name!r} is a materialized view, recomputed on every run, "
                "and cannot be read as a stream; read it with dp.read.table(...) or make it a streaming table"
            )
        if kind == SINK:
            raise HeadraceError(f"hr.read_stream.table({name!r}): {ds.name!r} is a sink, which flows write but cannot read")
        if getattr(reader, "_format", None) not in (None, "delta"):
            raise HeadraceError(f"hr.read_stream.format(...).table({name!r}): pipeline tables are Delta; drop format()")
        storage = self.graph.storage
        opts = {"skipChangeCommits": True, **storage.delta_options(), **dict(getattr(reader, "_options", {}))}
        import headrace as hr

        return hr.read_stream.format("delta").options(opts).load(storage.table_path(ds.name))

    def static_frame(self, name: str) -> Any:
        """``hr.read.table(name)``: the dataset as the core's lazy ``StaticFrame`` (what
        ``StreamFrame.join`` takes), read when the query joining it starts or at ``to_arrow``.
        A name that is no dataset of the pipeline reads the local warehouse's table, if any."""
        try:
            ds = self._lookup(name, "hr.read.table")
        except UnknownDataset:
            external = self._external(name)
            if external is None:
                raise
            return external.static_frame(name)
        kind = self.graph.kind_of(ds)
        if kind == TEMPORARY_VIEW:
            out = self._call_view(ds)
            if _is_stream(out):
                raise HeadraceError(f"hr.read.table({name!r}): temporary view {ds.name!r} is a stream; read it with hr.read_stream.table(...)")
            return out
        if kind == SINK:
            raise HeadraceError(f"hr.read.table({name!r}): {ds.name!r} is a sink, which flows write but cannot read")
        import headrace as hr

        storage = self.graph.storage
        return hr.read.format("delta").options(storage.delta_options()).load(storage.table_path(ds.name))

    def static_table(self, name: str) -> StaticFrame:
        """``dp.read.table(name)``: the dataset as a batch (the api's ``StaticFrame``, its lazily
        loaded kind), read when first used in the run and kept; in the dry run, never read."""
        ds = self._lookup(name, "dp.read.table")
        kind = self.graph.kind_of(ds)
        if kind == TEMPORARY_VIEW:
            out = self._call_view(ds)
            if isinstance(out, pa.Table):
                return StaticFrame.from_arrow(out)
            if isinstance(out, StaticFrame) or (hasattr(out, "to_arrow") and not _is_stream(out)):
                return self._wrap(out, ds.name)
            raise HeadraceError(
                f"dp.read.table({name!r}): temporary view {ds.name!r} is a stream; read it with hr.read_stream.table(...)"
            )
        if kind == SINK:
            raise HeadraceError(f"dp.read.table({name!r}): {ds.name!r} is a sink, which flows write but cannot read")
        if self.analysis:
            return StaticFrame.lazy(needs_data(ds.name), ds.name)
        storage = self.graph.storage
        return StaticFrame.lazy(lambda: storage.read(ds.name), ds.name)

    def _wrap(self, frame: Any, what: str) -> StaticFrame:
        """A view's batch result as a frame read once in the run (never in the dry run)."""
        if self.analysis:
            return StaticFrame.lazy(needs_data(what), what)
        if isinstance(frame, StaticFrame):
            return frame.cached()
        return StaticFrame.lazy(frame.to_arrow, what)

    def call(self, flow: Flow) -> Any:
        """Call the flow's query function with this resolver active."""
        assert flow.func is not None
        from headrace.pipelines import _context

        token = _context._config.set(dict(self.graph.configuration))
        try:
            with resolving(self):
                return flow.func()
        finally:
            _context._config.reset(token)


def _is_stream(obj: Any) -> bool:
    from headrace.api import StreamFrame

    return isinstance(obj, StreamFrame)


def result_kind(obj: Any) -> str | None:
    """``stream`` for a StreamFrame, ``static`` for a batch result (a ``StaticFrame``, a
    ``pyarrow.Table``, anything with ``to_arrow()``), None otherwise."""
    if _is_stream(obj):
        return STREAM
    if isinstance(obj, StaticFrame | pa.Table) or callable(getattr(obj, "to_arrow", None)):
        return STATIC
    return None


