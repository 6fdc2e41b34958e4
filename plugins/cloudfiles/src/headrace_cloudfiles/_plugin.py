"""The ``headrace`` entry point of headrace-cloudfiles: declares the ``cloudFiles`` connector.

Imports only option declarations: the source class (and pyarrow's readers, boto3, watchdog)
is imported when a query uses the connector.
"""

from __future__ import annotations

from headrace.plugins import ConnectorSpec, hookimpl
from headrace_cloudfiles._options import SOURCE_OPTIONS

__all__ = ["headrace_connectors"]


@hookimpl
def headrace_connectors() -> list[ConnectorSpec]:
    """The connectors of this plugin. Called once per process by the registry; cheap, no I/O."""
    return [
        ConnectorSpec(
            name="cloudFiles",
            aliases=("cloudfiles",),
            source="headrace_cloudfiles.source:CloudFilesSource",
            source_options=SOURCE_OPTIONS,
            description="Auto Loader-like incremental file ingestion (json, csv, parquet, text, binaryFile, avro) "
            "from a local folder or s3://, each file exactly once",
            requires=("pyarrow",),
            install_hint="pip install 'pyarrow>=14' (a dependency of headrace-cloudfiles)",
            api_version="1",  # the headrace plugin API it is written for
        )
    ]
