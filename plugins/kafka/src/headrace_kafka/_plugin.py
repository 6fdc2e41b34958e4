"""The plugin module behind the ``headrace`` entry point ``kafka``.

Imports only option declarations: confluent-kafka is imported when a query uses the connector.
"""

from __future__ import annotations

from headrace.plugins import ConnectorSpec, hookimpl
from headrace_kafka._options import SINK_OPTIONS, SOURCE_OPTIONS

__all__ = ["headrace_connectors"]


@hookimpl
def headrace_connectors() -> list[ConnectorSpec]:
    """The ``kafka`` connector. Called once per process by the registry; imports nothing heavy."""
    return [
        ConnectorSpec(
            name="kafka",
            source="headrace_kafka.source:KafkaSource",
            sink="headrace_kafka.sink:KafkaSink",
            source_options=SOURCE_OPTIONS,
            sink_options=SINK_OPTIONS,
            description="Apache Kafka topics (confluent-kafka): offsets in the checkpoint, at-least-once or "
            "transactional exactly-once sink, real-time trigger.",
            install_hint="pip install 'confluent-kafka>=2.3' (a dependency of headrace-kafka)",
            api_version="1",  # the headrace plugin API it is written for
            requires=("confluent_kafka",),
        )
    ]
