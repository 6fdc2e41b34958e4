"""``read_stream``: the reader builder (``format(...).option(...).schema(...).load(path)``).

Builders are immutable; ``load()`` validates the options before any I/O and returns a
:class:`~headrace.api.stream_frame.StreamFrame` whose source class is resolved only at ``start()``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from headrace.api.builder_options import _merge, _redacted_options, _schema_of, parse_schema
from headrace.api.stream_frame import StreamFrame
from headrace.errors import HeadraceError, redact
from headrace.plugins import registry
from headrace.query import SourcePlan

__all__ = ["DataStreamReader", "readStream", "read_stream"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataStreamReader:
    """Builds a streaming source: ``format(...).option(...).schema(...).load(path)``."""

    _format: str | None = None
    _options: Mapping[str, Any] = field(default_factory=dict)
    _schema: pa.Schema | None = None

    def __repr__(self) -> str:
        opts = _redacted_options(self._options, _schema_of(self._format, "source"))
        schema = f", schema={self._schema.to_string(show_schema_metadata=False)!r}" if self._schema is not None else ""
        return redact(f"DataStreamReader(format={self._format!r}, options={opts!r}{schema})")

    def format(self, source: str) -> DataStreamReader:
        """The connector name (``"delta"``, ``"kafka"``, ``"cloudFiles"``, ``"rate"``...)."""
        return replace(self, _format=source)

    def option(self, key: str, value: Any) -> DataStreamReader:
        return replace(self, _options=_merge(self._options, {key: value}))

    def options(self, options: Mapping[str, Any] | None = None, /, **kwargs: Any) -> DataStreamReader:
        return replace(self, _options=_merge(self._options, {**(options or {}), **kwargs}))

    def schema(self, schema: pa.Schema | str) -> DataStreamReader:
        """The schema to read with (a pyarrow.Schema or a DDL string), for sources that take one."""
        return replace(self, _schema=parse_schema(schema))

    def load(self, path: str | None = None) -> StreamFrame:
        """Validate the options (raising ``OptionsError`` before any I/O) and return the stream."""
        if not self._format:
            raise HeadraceError("read_stream needs a format: read_stream.format('delta')...; see `headrace connectors`")
        spec = registry().get(self._format)
        raw = dict(self._options)
        if path is not None:
            raw = _merge(raw, {"path": path})
        if spec.source is None:
            raise HeadraceError(
                f"connector '{spec.name}' cannot be read from (it is a sink only); "
                f"connectors with sources: {', '.join(s.name for s in registry().specs() if s.source)}"
            )
        opts = spec.source_options.parse(raw, connector=spec.name, role="source")
        plan = SourcePlan(
            connector=spec.name,
            options=opts,
            source_class=type,  # resolved at start(): importing the class imports its client library
            user_schema=self._schema,
            path=str(raw.get("path")) if raw.get("path") is not None else None,
            raw_options=raw,
        )
        return StreamFrame((plan,), (), self._schema)

    def table(self, name: str) -> StreamFrame:
        """Table ``name`` as a stream. Inside a definition a declarative pipeline calls
        (``headrace.pipelines``), another dataset of the pipeline: a streaming table read
        incrementally with the delta source (options set on this reader go to it), a temporary
        view inlined; the name becomes an edge of the pipeline's graph. Elsewhere a Delta table
        of the local warehouse (:mod:`headrace.api.warehouse`), read with the delta source: one
        a query wrote with ``write_stream.to_table(name)``. Raises, naming the tables there, for
        an unknown one.
        """
        from headrace.api.catalog import current_catalog

        return current_catalog().stream_table(name, self)


read_stream = DataStreamReader()
"""The entry point: ``hr.read_stream.format(...)``."""

readStream = read_stream
"""PySpark's name of :data:`read_stream`: ``hr.readStream.format(...)`` (so a snippet's
``spark.readStream`` runs with ``spark = hr``)."""
