"""The ``headrace`` entry point of headrace-lakebase: declares the ``lakebase`` connector (alias
``postgresql``) and adds this plugin's own hookspecs. Imports neither psycopg nor the sink."""

from __future__ import annotations

import pluggy

from headrace.plugins import ConnectorSpec, hookimpl
from headrace_lakebase import hookspecs
from headrace_lakebase._options import SINK_OPTIONS

__all__ = ["headrace_addhooks", "headrace_connectors"]


@hookimpl
def headrace_connectors() -> list[ConnectorSpec]:
    """The ``lakebase`` sink. Called once per process, on the first connector lookup."""
    return [
        ConnectorSpec(
            name="lakebase",
            aliases=("postgresql",),
            sink="headrace_lakebase.sink:LakebaseSink",
            sink_options=SINK_OPTIONS,
            description="Batched, exactly-once upserts (or inserts) into PostgreSQL / Databricks Lakebase.",
            requires=("psycopg",),
            install_hint="pip install headrace-lakebase",
            api_version="1",  # the headrace plugin API it is written for
        )
    ]


@hookimpl
def headrace_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Add ``headrace_lakebase_resolve_endpoint``. Called once when this module is registered."""
    pluginmanager.add_hookspecs(hookspecs.LakebaseHookSpecs)
