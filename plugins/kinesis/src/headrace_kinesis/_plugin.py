"""Entry point of headrace-kinesis: declares the ``kinesis`` connector without importing boto3."""

from __future__ import annotations

from headrace.plugins import ConnectorSpec, hookimpl
from headrace_kinesis._options import SINK_OPTIONS, SOURCE_OPTIONS

__all__ = ["headrace_connectors"]


@hookimpl
def headrace_connectors() -> list[ConnectorSpec]:
    """The ``kinesis`` connector. Called once per process by the registry; imports nothing heavy."""
    return [
        ConnectorSpec(
            name="kinesis",
            source="headrace_kinesis.source:KinesisSource",
            sink="headrace_kinesis.sink:KinesisSink",
            source_options=SOURCE_OPTIONS,
            sink_options=SINK_OPTIONS,
            description="AWS Kinesis Data Streams: replayable per-shard source with resharding; put_records sink (at-least-once).",
            requires=("boto3",),
            install_hint="pip install 'boto3>=1.28' (a dependency of headrace-kinesis)",
            api_version="1",  # the headrace plugin API it is written for
        )
    ]
