"""The ``headrace`` entry point of headrace-pubsub: declares the ``pubsub`` connector.

Imports only option declarations; google-cloud-pubsub is imported when the source or sink class
is loaded (the first time a query uses the connector).
"""

from __future__ import annotations

from headrace.plugins import ConnectorSpec, hookimpl
from headrace_pubsub._options import SINK_OPTIONS, SOURCE_OPTIONS

__all__ = ["headrace_connectors"]


@hookimpl
def headrace_connectors() -> list[ConnectorSpec]:
    """The ``pubsub`` connector. Called once per process by the registry; imports nothing heavy."""
    return [
        ConnectorSpec(
            name="pubsub",
            source="headrace_pubsub.source:PubSubSource",
            sink="headrace_pubsub.sink:PubSubSink",
            source_options=SOURCE_OPTIONS,
            sink_options=SINK_OPTIONS,
            description=(
                "Google Pub/Sub: a source made replayable by staging pulled messages in the checkpoint "
                "(exactly-once with an idempotent sink), and an at-least-once publishing sink."
            ),
            requires=("google.cloud.pubsub_v1",),
            install_hint="pip install 'google-cloud-pubsub>=2.20' (a dependency of headrace-pubsub)",
            api_version="1",  # the headrace plugin API it is written for
        )
    ]
