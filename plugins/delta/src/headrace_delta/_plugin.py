"""The ``headrace`` entry point of headrace-delta. Imports option declarations only, never deltalake."""

from __future__ import annotations

from headrace.plugins import ConnectorSpec, hookimpl
from headrace_delta._options import SINK_OPTIONS, SOURCE_OPTIONS

__all__ = ["headrace_connectors"]


@hookimpl
def headrace_connectors() -> list[ConnectorSpec]:
    """The ``delta`` connector. Called once per process when connectors are first looked up."""
    return [
        ConnectorSpec(
            name="delta",
            source="headrace_delta.source:DeltaSource",
            sink="headrace_delta.sink:DeltaSink",
            source_options=SOURCE_OPTIONS,
            sink_options=SINK_OPTIONS,
            description="Delta Lake tables (delta-rs): a streaming source over the transaction log and an "
            "exactly-once sink with app transactions.",
            requires=("deltalake",),
            install_hint="pip install 'deltalake>=1.0' (a dependency of headrace-delta)",
            api_version="1",  # the headrace plugin API it is written for
        )
    ]
