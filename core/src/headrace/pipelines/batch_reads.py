"""Batch reads inside a pipeline: ``dp.read`` and ``dp.stream_static_join``.

``dp.read`` is the api's static reader (``hr.read``) with the pipeline's ways: ``table(name)``
reads another dataset of the pipeline (an edge of the graph), ``load(path)`` resolves a
relative path against the pipeline's folder. Both give the api's one ``StaticFrame``
(:mod:`headrace.api.static`), in its lazily loaded, kept kind: nothing is read when a
definition is called (the dry run calls every definition without touching data, and a frame
it makes raises :class:`NeedsData` if forced); the first ``to_arrow()`` of a run reads it, and
that snapshot is kept for the rest of the run, so a stream-static join sees the dimension
table as it was when the stream started (seeds/004).

    dims = dp.read.table("customers")                         # another dataset of the pipeline
    facts = hr.read_stream.table("transactions")
    return facts.join(dims, on="customer_id")                 # or dp.stream_static_join(facts, dims, ...)

``format(...).load(path)`` goes through the connector registry exactly as ``hr.read`` does
(a connector such as ``delta``, or one of Spark's file formats: ``parquet``, ``json``,
``csv``, ``arrow``): its options are validated when ``load`` is called, an unknown one is an
``OptionsError``, before anything is read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from headrace.api.static import DataFrameReader, StaticFrame
from headrace.errors import HeadraceError
from headrace.pipelines._context import active_resolver
from headrace.transforms.stateless import SchemaUnknown

__all__ = ["NeedsData", "StaticFrame", "StaticReader", "needs_data", "read", "stream_static_join"]


class NeedsData(HeadraceError, SchemaUnknown):
    """Raised by a batch read's ``to_arrow()`` (or ``schema``) while the dry run analyses
    definitions (no I/O). A ``SchemaUnknown`` too: a stream joined with such a frame in a
    definition leaves its checks to the run."""


def needs_data(what: str) -> Callable[[], pa.Table]:
    """The loader of a dry run's batch read: raises :class:`NeedsData` naming ``what``."""

    def load() -> pa.Table:
        raise NeedsData(f"{what} is read when the pipeline runs, not by the dry run")

    return load


def stream_static_join(stream: Any, static: Any, on: str | Sequence[str], how: str = "inner") -> Any:
    """Join each micro-batch of ``stream`` with ``static`` (a ``StaticFrame`` or a
    ``pyarrow.Table``, snapshotted when the flow starts): Spark's stream-static join,
    ``stream.join(static, on, how)``; ``how`` is ``inner``, ``left``, ``left_semi`` or
    ``left_anti`` (the stream on the left)."""
    return stream.join(static, on=on, how=how)


class StaticReader(DataFrameReader):
    """``dp.read``: batch reads, of pipeline datasets (``table(name)``) or through a connector or
    file format (``format(...).option(...).load(path)``)."""

    def table(self, name: str) -> StaticFrame:
        """Another dataset of the pipeline, read as a batch (an edge of the graph). Only inside
        a definition that the pipeline runner (or dry run) calls."""
        resolver = active_resolver()
        if resolver is None:
            raise HeadraceError(
                f"dp.read.table({name!r}) reads a dataset of a declarative pipeline and works only inside a "
                "definition the pipeline calls; outside one, read the table's files: dp.read.format('delta').load(path)"
            )
        frame: StaticFrame = resolver.static_table(name)
        return frame

    def load(self, path: str | None = None) -> StaticFrame:
        """The connector's (or files') data, read when the frame is first used and kept for the
        run. The options are validated now (``OptionsError``), before any I/O; a relative path
        is resolved against the pipeline's folder."""
        if not self._format:
            raise HeadraceError("dp.read needs a format: dp.read.format('delta').load(path)")
        resolver = active_resolver()
        if resolver is not None and path is not None:
            path = resolver.resolve_path(path)
        frame = super().load(path)
        what = f"{self._format}:{path}" if path is not None else self._format
        if resolver is not None and resolver.analysis:
            return StaticFrame.lazy(needs_data(what), what)
        return frame.cached()


read = StaticReader()
"""``dp.read``: batch reads (the counterpart of ``hr.read_stream``)."""
