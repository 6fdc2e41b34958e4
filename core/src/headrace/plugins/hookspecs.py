"""The plugin interface: pluggy markers (``hookspec``, ``hookimpl``), the hooks a plugin may
implement (``HeadraceHookSpecs``) and the version of this interface (``PLUGIN_API_VERSION``).

Hooks are called by the registry (:mod:`headrace.plugins.discovery`): ``headrace_connectors``
and ``headrace_engines`` once per process, ``headrace_addhooks`` once per registered plugin, the ``headrace_query_*``
hooks once per query event on the query's thread.
"""

from __future__ import annotations

import logging
from typing import Any

import pluggy

from headrace.plugins.spec import ConnectorSpec, EngineSpec

__all__ = ["PLUGIN_API_VERSION", "HeadraceHookSpecs", "hookimpl", "hookspec"]

log = logging.getLogger(__name__)

PLUGIN_API_VERSION = "1.1"
"""The plugin interface this core implements: a plugin whose ``api_version`` has another major
version is refused. The minor version grows with backwards-compatible additions."""
PLUGINS_ENV = "HEADRACE_PLUGINS"
"""Comma-separated plugin modules registered in addition to the entry points (not packaged yet)."""
hookspec = pluggy.HookspecMarker("headrace")
hookimpl = pluggy.HookimplMarker("headrace")


class HeadraceHookSpecs:
    """The hooks a headrace plugin may implement (all optional)."""

    @hookspec
    def headrace_connectors(self) -> list[ConnectorSpec]:  # type: ignore[empty-body]
        """Return the connectors this plugin provides.

        Called once per process, the first time any connector is looked up. Must be cheap and
        must not import client libraries.
        """

    @hookspec
    def headrace_engines(self) -> list[EngineSpec]:  # type: ignore[empty-body]
        """Return the query engines this plugin provides (``start(path, engine=obj)`` runs a
        query definition on the engine whose ``EngineSpec.accepts`` names ``obj``'s type).

        Called once per process, when plugins are registered. Must be cheap and must not import
        the engine's library. Added in plugin API 1.1.
        """

    @hookspec(historic=True)
    def headrace_addhooks(self, pluginmanager: pluggy.PluginManager) -> None:
        """Add hookspecs of your own (``pluginmanager.add_hookspecs(module)``), e.g. for plugins
        of your plugin. Called once when your plugin module is registered."""

    @hookspec
    def headrace_query_started(self, event: dict[str, Any]) -> None:
        """Called once when a query starts, after its checkpoint is opened, with ``id``,
        ``runId``, ``name``, ``timestamp`` and the ``deliveryGuarantee``. Must not raise."""

    @hookspec
    def headrace_query_progress(self, progress: dict[str, Any]) -> None:
        """Called after every batch with the progress report (``QueryProgress.to_dict()``), on
        the query's thread: keep it quick."""

    @hookspec
    def headrace_query_terminated(self, event: dict[str, Any]) -> None:
        """Called once when a query ends, with ``id``, ``runId``, ``name``, ``exception`` (a
        string or None), ``lastBatchId`` and ``failedBatchId`` (the batch that failed, or None)."""
