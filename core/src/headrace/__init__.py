"""headrace: move data between streams and the lakehouse, with Spark Structured Streaming's semantics.

    import headrace as hr
    q = (hr.read_stream.format("rate-micro-batch").option("rowsPerBatch", 1000).load()
           .write_stream.format("memory").query_name("out").trigger(available_now=True).start())
    q.await_termination()
    hr.memory_table("out")
"""

from __future__ import annotations

from typing import Any

from headrace.api import DataStreamReader, DataStreamWriter, GroupedStream, StreamFrame, read_stream
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
from headrace.transforms.static import DataFrameReader, StaticFrame, read

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "ConnectorNotFoundError",
    "DataFrameReader",
    "DataLossError",
    "DataStreamReader",
    "DataStreamWriter",
    "GroupedStream",
    "HeadraceError",
    "OptionsError",
    "PluginError",
    "QueryProgress",
    "SchemaChangedError",
    "StaticFrame",
    "StreamFrame",
    "StreamingQuery",
    "StreamingQueryException",
    "Trigger",
    "UnsupportedError",
    "memory_table",
    "read",
    "read_stream",
    "registry",
    "session_window",
    "window",
]


def __getattr__(name: str) -> Any:
    # time windows live with the stateful operators, imported only when used
    if name in ("window", "session_window"):
        import importlib

        return getattr(importlib.import_module("headrace.transforms.window"), name)
    raise AttributeError(f"module 'headrace' has no attribute {name!r}")
