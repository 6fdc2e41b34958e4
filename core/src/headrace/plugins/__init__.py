"""Plugin discovery: pluggy hookspecs, the ``headrace`` entry-point group, the connector registry.

A plugin is a distribution with one entry point in the ``headrace`` group whose value is a
small module of hook implementations::

    [project.entry-points.headrace]
    kafka = "headrace_kafka._plugin"

    # headrace_kafka/_plugin.py  -- must not import confluent_kafka
    from headrace.plugins import ConnectorSpec, hookimpl
    from headrace_kafka._options import SOURCE_OPTIONS, SINK_OPTIONS

    @hookimpl
    def headrace_connectors():
        return [ConnectorSpec(name="kafka", source="headrace_kafka.source:KafkaSource",
                              sink="headrace_kafka.sink:KafkaSink", source_options=SOURCE_OPTIONS,
                              sink_options=SINK_OPTIONS, requires=("confluent_kafka",),
                              install_hint="pip install headrace-kafka")]

The registry loads entry points lazily, on the first lookup, and imports a connector's class
(and so its client library) only when the connector is used. A plugin module that fails to
import is remembered and reported when one of its connectors (or its entry-point name) is
asked for (matched by its entry-point name or distribution, never by text inside its error);
other plugins keep working. Two plugins claiming one connector name is an error naming both
distributions, raised when that name is asked for.

Plugin API version: :data:`PLUGIN_API_VERSION` is the version of this interface (hookspecs,
:class:`ConnectorSpec`, the Source/Sink protocols) the core implements. A plugin says which one
it was written for in ``ConnectorSpec(api_version="1")``; one for another major version is
refused, naming the plugin, both versions and the fix. A misspelled or undecorated hook
(``def headrace_connector()``) and a plugin that registers no connector are reported by
:meth:`Registry.problems` and ``headrace connectors``.

A plugin may also provide query engines (``headrace_engines`` returning :class:`EngineSpec`):
``DataStreamWriter.start(path, engine=obj)`` hands the query definition to the engine that
accepts ``obj``'s type, e.g. the core's Spark engine for a ``SparkSession``.

One job per module: :mod:`~headrace.plugins.spec` (``ConnectorSpec``, ``EngineSpec``),
:mod:`~headrace.plugins.hookspecs` (the hooks, the markers and the API version) and
:mod:`~headrace.plugins.discovery` (the registry); every name is importable from
``headrace.plugins``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from headrace._lazy import lazy_attributes
from headrace.plugins.spec import ConnectorSpec, EngineSpec

if TYPE_CHECKING:  # imported on first use (PEP 562 __getattr__ below)
    from headrace.plugins.discovery import (
        ENTRY_POINT_GROUP,
        FIRST_PARTY,  # noqa: F401  (importable from here, as before the split)
        PLUGINS_ENV,
        Registry,
        register_listener,
        registry,
        unregister_listener,
    )
    from headrace.plugins.hookspecs import PLUGIN_API_VERSION, HeadraceHookSpecs, hookimpl, hookspec

__all__ = [
    "ENTRY_POINT_GROUP",
    "PLUGIN_API_VERSION",
    "PLUGINS_ENV",
    "ConnectorSpec",
    "EngineSpec",
    "HeadraceHookSpecs",
    "Registry",
    "hookimpl",
    "hookspec",
    "register_listener",
    "registry",
    "unregister_listener",
]

log = logging.getLogger(__name__)

# Discovery (pluggy, importlib.metadata: ~25 ms) is imported when first used, not with the
# package: a process that only unpickles a ConnectorSpec (Spark's Python workers running a
# headrace.spark data source) needs none of it.
_LAZY = {
    "ENTRY_POINT_GROUP": "headrace.plugins.discovery",
    "FIRST_PARTY": "headrace.plugins.discovery",
    "PLUGINS_ENV": "headrace.plugins.discovery",
    "Registry": "headrace.plugins.discovery",
    "register_listener": "headrace.plugins.discovery",
    "registry": "headrace.plugins.discovery",
    "unregister_listener": "headrace.plugins.discovery",
    "PLUGIN_API_VERSION": "headrace.plugins.hookspecs",
    "HeadraceHookSpecs": "headrace.plugins.hookspecs",
    "hookimpl": "headrace.plugins.hookspecs",
    "hookspec": "headrace.plugins.hookspecs",
}


__getattr__, __dir__ = lazy_attributes(globals(), _LAZY)
