"""The ``headrace`` entry point of headrace-lakebase: declares the ``lakebase`` connector (alias
``postgresql``) and adds this plugin's own hookspecs. Imports neither psycopg nor the sink."""

from __future__ import annotations

import pluggy

from headrace.plugins import ConnectorSpec, hookimpl
from headrace_lakebase import hookspecs
from headrace_lakebase._options import SINK_OPTIONS
from headrace_lakebase.cdc_options import SOURCE_OPTIONS

__all__ = ["headrace_addhooks", "headrace_connectors"]


@hookimpl
def headrace_connectors() -> list[ConnectorSpec]:
    """The ``lakebase`` sink and change source. Called once per process, on the first connector lookup."""
    return [
        ConnectorSpec(
            name="lakebase",
            aliases=("postgresql",),
            sink="headrace_lakebase.sink:LakebaseSink",
            sink_options=SINK_OPTIONS,
            source="headrace_lakebase.cdc_source:LakebaseChangeSource",
            source_options=SOURCE_OPTIONS,
            description="Batched, exactly-once upserts (or inserts, or AUTO CDC) into PostgreSQL / Databricks Lakebase, "
            "and a change source (logical replication, pgoutput).",
            requires=("psycopg", "numpy"),
            install_hint="pip install 'psycopg[binary]>=3.2' 'numpy>=1.25' (dependencies of headrace-lakebase)",
            api_version="1",  # the headrace plugin API it is written for
        )
    ]


@hookimpl
def headrace_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Add ``headrace_lakebase_resolve_endpoint``. Called once when this module is registered."""
    pluginmanager.add_hookspecs(hookspecs.LakebaseHookSpecs)
