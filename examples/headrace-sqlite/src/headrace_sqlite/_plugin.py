"""The ``headrace`` entry point of headrace-sqlite: says what the plugin provides, imports nothing heavy.

Called once per process, the first time any connector is looked up. The source and sink classes
are named as ``"module:Class"`` strings and imported only when a query uses them.
"""

from __future__ import annotations

from headrace.plugins import ConnectorSpec, hookimpl
from headrace_sqlite._options import SINK_OPTIONS, SOURCE_OPTIONS

__all__ = ["headrace_connectors"]


@hookimpl
def headrace_connectors() -> list[ConnectorSpec]:
    """The ``sqlite`` connector."""
    return [
        ConnectorSpec(
            name="sqlite",
            source="headrace_sqlite.source:SqliteSource",
            source_options=SOURCE_OPTIONS,
            sink="headrace_sqlite.sink:SqliteSink",
            sink_options=SINK_OPTIONS,
            # what `headrace connectors` shows: say what it connects to once your system replaces SQLite
            description="SQLite tables: exactly-once source, exactly-once sink",
            install_hint="pip install headrace-sqlite",
            api_version="1",  # the headrace plugin API this plugin is written for
        )
    ]
