"""headrace: move data between streams and the lakehouse, with Spark Structured Streaming's semantics.

    import headrace as hr
    q = (hr.read_stream.format("rate-micro-batch").option("rowsPerBatch", 1000).load()
           .write_stream.format("memory").query_name("out").trigger(available_now=True).start())
    q.await_termination()
    hr.memory_table("out")
"""

from __future__ import annotations

from headrace.api import DataStreamReader, DataStreamWriter, StreamFrame, read_stream
from headrace.connectors.memory import memory_table
from headrace.errors import (
    CheckpointError,
    ConnectorNotFoundError,
    DataLossError,
    HeadraceError,
    OptionsError,
    PluginError,
    SchemaChangedError,
    StreamingQueryException,
    UnsupportedError,
)
from headrace.plugins import registry
from headrace.progress import QueryProgress
from headrace.query import StreamingQuery, Trigger

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "ConnectorNotFoundError",
    "DataLossError",
    "DataStreamReader",
    "DataStreamWriter",
    "HeadraceError",
    "OptionsError",
    "PluginError",
    "QueryProgress",
    "SchemaChangedError",
    "StreamFrame",
    "StreamingQuery",
    "StreamingQueryException",
    "Trigger",
    "UnsupportedError",
    "memory_table",
    "read_stream",
    "registry",
]
