"""Hooks that plugins of this plugin implement (registered by ``headrace_lakebase._plugin``).

A Databricks authentication plugin resolves ``endpoint`` (``project_id.branch_id[.endpoint_id]``)
into connection parameters and a token provider::

    from headrace.plugins import hookimpl
    from headrace_lakebase import ConnectionParams

    @hookimpl
    def headrace_lakebase_resolve_endpoint(endpoint, options):
        host = lookup_host(endpoint)                      # e.g. the Databricks SDK
        return ConnectionParams(host=host, user="me@example.com", sslmode="require",
                                password_provider=lambda: fresh_oauth_token())

Register it through the ``headrace`` entry-point group (or ``headrace.registry().register_module``).
"""

from __future__ import annotations

from typing import Any

from headrace.plugins import hookspec
from headrace_lakebase.params import ConnectionParams

__all__ = ["LakebaseHookSpecs"]


class LakebaseHookSpecs:
    """The hooks of the ``lakebase`` sink."""

    @hookspec(firstresult=True)
    def headrace_lakebase_resolve_endpoint(
        self, endpoint: str, options: dict[str, Any]
    ) -> ConnectionParams | None:
        """Resolve a Lakebase ``endpoint`` into connection parameters, or return None when this
        implementation does not handle it (the next one is asked).

        Called when a ``lakebase`` sink with the ``endpoint`` option first connects: once per
        sink instance (once per query run in the local engine, once per task under Spark), and
        again after every reconnect only through ``ConnectionParams.password_provider`` (which
        is called at each connection attempt, so short-lived tokens stay fresh). ``options``
        are the sink's given options with secrets redacted. The returned object must be
        picklable if the sink runs under Spark. The first non-None result wins.
        """
