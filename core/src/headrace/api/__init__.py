"""The fluent reader/writer, in PySpark's shape with snake_case names::

    import headrace as hr

    q = (hr.read_stream.format("rate-micro-batch").option("rowsPerBatch", 1000).load()
           .select_expr("value", "value % 10 AS bucket")   # SQL (DuckDB) over each batch
           .where("bucket < 5")
           .map_batches(lambda t: t)                      # pyarrow.Table in, pyarrow.Table out
           .write_stream.format("memory").query_name("out")
           .output_mode("append").option("checkpointLocation", "/tmp/chk")
           .trigger(available_now=True).start())
    q.await_termination()
    hr.memory_table("out")                                # -> pyarrow.Table

Builders are immutable: every call returns a new one, so a half-built reader can be reused.
Options are validated when ``load()`` / ``start()`` is called, before any I/O. A stream's
transforms are its plan: a tuple of operators (``headrace.transforms``) run by the engine.

One job per module: :mod:`~headrace.api.reader` (``read_stream``), :mod:`~headrace.api.stream_frame`
(``StreamFrame``, ``GroupedStream``), :mod:`~headrace.api.writer` (``DataStreamWriter``),
:mod:`~headrace.api.triggers` (``trigger(...)`` keywords) and
:mod:`~headrace.api.builder_options` (how builders hold options), whose names are importable
from ``headrace.api``; :mod:`~headrace.api.static` (``read``, ``StaticFrame``),
:mod:`~headrace.api.catalog` (the table-name seam) and :mod:`~headrace.api.engines` (the seam to
other engines: ``start(engine=...)``).
"""

from __future__ import annotations

import logging

from headrace.api.builder_options import (  # noqa: F401  (importable from here, as before the split)
    _merge,
    _redacted_options,
    _schema_of,
    parse_schema,
)
from headrace.api.reader import DataStreamReader, read_stream, readStream
from headrace.api.stream_frame import GroupedStream, StreamFrame
from headrace.api.triggers import MAX_TRIGGER_INTERVAL, TRIGGER_KINDS, make_trigger  # noqa: F401
from headrace.api.writer import (  # noqa: F401
    _NO_CHECKPOINT_NEEDED,
    ENGINE_WRITER_OPTIONS,
    STATE_STORES,
    DataStreamWriter,
)

__all__ = ["DataStreamReader", "DataStreamWriter", "GroupedStream", "StreamFrame", "readStream", "read_stream"]

log = logging.getLogger(__name__)
