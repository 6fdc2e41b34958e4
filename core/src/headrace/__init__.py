"""headrace: move data between streams and the lakehouse, with Spark Structured Streaming's semantics.

    import headrace as hr
    q = (hr.read_stream.format("rate-micro-batch").option("rowsPerBatch", 1000).load()
           .write_stream.format("memory").query_name("out").trigger(available_now=True).start())
    q.await_termination()
    hr.memory_table("out")

``import headrace`` loads nothing but this module: each public name is imported from its
module the first time it is used (``hr.read_stream``, ``from headrace import StreamingQuery``),
through the module-level ``__getattr__`` of PEP 562. A process that needs only part of headrace
(Spark's Python workers unpickling a ``headrace.spark`` data source, a plugin importing
``headrace.options``) does not pay for the engine, the transforms or pyarrow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names below, for type checkers and IDEs; at run time __getattr__ imports them
    # subpackages an eager import used to load (``hr.progress``): see _SUBMODULES
    from headrace import api as api
    from headrace import checkpoint as checkpoint
    from headrace import connectors as connectors
    from headrace import engine as engine
    from headrace import errors as errors
    from headrace import functions as functions
    from headrace import history as history
    from headrace import options as options
    from headrace import plugins as plugins
    from headrace import progress as progress
    from headrace import protocols as protocols
    from headrace import query as query
    from headrace import transforms as transforms
    from headrace.api import (
        DataStreamReader,
        DataStreamWriter,
        GroupedStream,
        StreamFrame,
        read_stream,
        readStream,
    )
    from headrace.api.static import DataFrameReader, StaticFrame, read
    from headrace.api.warehouse import set_warehouse
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
    from headrace.transforms.spark_sql import sql_dialect
    from headrace.transforms.transform_with_state import (
        ExpiredTimerInfo,
        KeyBatch,
        ListState,
        MapState,
        StatefulProcessor,
        StatefulProcessorHandle,
        TimerValues,
        ValueState,
    )
    from headrace.transforms.window import session_window, window

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "ConnectorNotFoundError",
    "DataFrameReader",
    "DataLossError",
    "DataStreamReader",
    "DataStreamWriter",
    "ExpiredTimerInfo",
    "GroupedStream",
    "HeadraceError",
    "KeyBatch",
    "ListState",
    "MapState",
    "OptionsError",
    "PluginError",
    "QueryProgress",
    "SchemaChangedError",
    "StatefulProcessor",
    "StatefulProcessorHandle",
    "StaticFrame",
    "StreamFrame",
    "StreamingQuery",
    "StreamingQueryException",
    "TimerValues",
    "Trigger",
    "UnsupportedError",
    "ValueState",
    "memory_table",
    "read",
    "readStream",
    "read_stream",
    "registry",
    "session_window",
    "set_warehouse",
    "sql_dialect",
    "window",
]

# public name -> the module that defines it (tests/core/test_import_weight.py checks that this
# covers __all__ exactly)
_LAZY: dict[str, str] = {
    "DataStreamReader": "headrace.api",
    "DataStreamWriter": "headrace.api",
    "GroupedStream": "headrace.api",
    "StreamFrame": "headrace.api",
    "read_stream": "headrace.api",
    "readStream": "headrace.api",
    "memory_table": "headrace.connectors.memory",
    "CheckpointError": "headrace.errors",
    "ConnectorNotFoundError": "headrace.errors",
    "DataLossError": "headrace.errors",
    "HeadraceError": "headrace.errors",
    "OptionsError": "headrace.errors",
    "PluginError": "headrace.errors",
    "SchemaChangedError": "headrace.errors",
    "StreamingQueryException": "headrace.errors",
    "UnsupportedError": "headrace.errors",
    "registry": "headrace.plugins",
    "QueryProgress": "headrace.progress",
    "StreamingQuery": "headrace.query",
    "Trigger": "headrace.query",
    "DataFrameReader": "headrace.api.static",
    "StaticFrame": "headrace.api.static",
    "read": "headrace.api.static",
    "set_warehouse": "headrace.api.warehouse",
    "session_window": "headrace.transforms.window",
    "sql_dialect": "headrace.transforms.spark_sql",
    "window": "headrace.transforms.window",
    "ExpiredTimerInfo": "headrace.transforms.transform_with_state",
    "KeyBatch": "headrace.transforms.transform_with_state",
    "ListState": "headrace.transforms.transform_with_state",
    "MapState": "headrace.transforms.transform_with_state",
    "StatefulProcessor": "headrace.transforms.transform_with_state",
    "StatefulProcessorHandle": "headrace.transforms.transform_with_state",
    "TimerValues": "headrace.transforms.transform_with_state",
    "ValueState": "headrace.transforms.transform_with_state",
}

# Subpackages that an eager ``import headrace`` used to load as a side effect: ``hr.progress``
# and the like keep working without an explicit ``import headrace.progress``.
_SUBMODULES = frozenset(
    {"api", "checkpoint", "connectors", "engine", "errors", "functions", "history", "options", "plugins",
     "progress", "protocols", "query", "transforms"}
)


def __getattr__(name: str) -> Any:
    """Import a public name (or one of the subpackages listed above) on first use and keep it
    in the module's namespace, so later lookups are plain attribute reads."""
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module 'headrace' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names, the subpackages and the module's dunders (not this file's helpers)."""
    own = {n for n in globals() if n.startswith("__")}
    loaded = {n for n, v in globals().items() if getattr(v, "__name__", "") == f"{__name__}.{n}"}
    return sorted(own | loaded | set(__all__) | _SUBMODULES)
