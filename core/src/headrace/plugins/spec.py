"""``ConnectorSpec`` and ``EngineSpec``: what a plugin says about one connector or one query
engine, and loading their code lazily.

Specs are built once per process by a plugin's ``headrace_connectors`` / ``headrace_engines``
hook (cheap: no client library imported); ``load_source``/``load_sink``/``load_factory`` import
the ``"module:attribute"`` paths when first used, after checking that the ``requires`` import
names are installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from headrace.errors import PluginError
from headrace.options import OptionSchema

__all__ = ["ConnectorSpec", "EngineSpec"]

log = logging.getLogger(__name__)


def _importable(name: str) -> bool:
    """True when ``name`` can be imported (its parent packages are imported to find it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@dataclass(frozen=True)
class ConnectorSpec:
    """What a plugin says about one connector. Cheap to build: no client library imported.

    ``source`` / ``sink`` are lazy ``"module:Class"`` paths. ``requires`` lists the import
    names of the client libraries the classes need; when one is missing the error says
    ``install_hint``. ``api_version`` is the plugin API (:data:`PLUGIN_API_VERSION`) the plugin
    was written for, e.g. ``"1"``; empty means unstated (taken as compatible).
    """

    name: str
    source: str | None = None
    sink: str | None = None
    source_options: OptionSchema = field(default_factory=OptionSchema)
    sink_options: OptionSchema = field(default_factory=OptionSchema)
    aliases: tuple[str, ...] = ()
    description: str = ""
    install_hint: str = ""
    requires: tuple[str, ...] = ()
    distribution: str = ""
    api_version: str = ""

    def missing_requirements(self) -> list[str]:
        """Import names in ``requires`` that are not installed (checked without importing them;
        a dotted name whose parent package is missing, e.g. ``google.cloud.pubsub_v1`` without
        any ``google`` package, counts as missing instead of raising)."""
        return [r for r in self.requires if not _importable(r)]

    def load_source(self) -> type:
        """Import and return the source class. Called once per query start."""
        if not self.source:
            raise PluginError(f"connector '{self.name}' has no source; it can only be written to")
        return self._load(self.source)

    def load_sink(self) -> type:
        """Import and return the sink class. Called once per query start."""
        if not self.sink:
            raise PluginError(f"connector '{self.name}' has no sink; it can only be read from")
        return self._load(self.sink)

    def _load(self, path: str) -> type:
        missing = self.missing_requirements()
        if missing:
            hint = self.install_hint or f"pip install {' '.join(missing)}"
            raise PluginError(
                f"connector '{self.name}' needs {', '.join(missing)}, which is not installed; fix: {hint}"
            )
        module_name, _, attr = path.partition(":")
        try:
            module = importlib.import_module(module_name)
            return getattr(module, attr)
        except ImportError as e:
            hint = self.install_hint or "reinstall the plugin"
            raise PluginError(f"connector '{self.name}': cannot import {path} ({e}); fix: {hint}") from e
        except AttributeError as e:
            raise PluginError(
                f"connector '{self.name}': {module_name} has no {attr!r}; the plugin "
                f"{self.distribution or ''} is broken, report it to its authors"
            ) from e


@dataclass(frozen=True)
class EngineSpec:
    """A query engine that ``DataStreamWriter.start(path, engine=obj)`` can hand a query
    definition to, instead of headrace's own engine. Cheap to build: nothing of the engine's
    library is imported.

    ``accepts`` are the fully qualified class names of the engine objects a user passes (e.g.
    ``"pyspark.sql.session.SparkSession"``), matched against every class of the object's type
    (its MRO), so the library is never imported to ask. ``factory`` is a lazy
    ``"module:function"`` path: called with the user's object, it returns the query engine
    (an object with ``start_query(writer, path)``, see ``headrace.api.engines.QueryEngine``).
    ``description`` says what ``engine=`` takes, for errors (``"a SparkSession or ..."``).
    """

    name: str
    accepts: tuple[str, ...]
    factory: str
    description: str = ""
    requires: tuple[str, ...] = ()
    install_hint: str = ""
    distribution: str = ""

    def takes(self, obj: object) -> bool:
        """Whether ``obj``'s type (or one of its bases) is one of :attr:`accepts`. Called by
        the registry once per ``start(engine=...)``; imports nothing."""
        names = {f"{c.__module__}.{c.__qualname__}" for c in type(obj).__mro__}
        return any(a in names for a in self.accepts)

    def load_factory(self) -> Callable[[Any], Any]:
        """Import and return the factory. Called once per ``start(engine=...)``."""
        missing = [r for r in self.requires if not _importable(r)]
        if missing:
            hint = self.install_hint or f"pip install {' '.join(missing)}"
            raise PluginError(f"query engine '{self.name}' needs {', '.join(missing)}, which is not installed; fix: {hint}")
        module_name, _, attr = self.factory.partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), attr)
        except ImportError as e:
            hint = self.install_hint or "reinstall the plugin"
            raise PluginError(f"query engine '{self.name}': cannot import {self.factory} ({e}); fix: {hint}") from e
        except AttributeError as e:
            raise PluginError(
                f"query engine '{self.name}': {module_name} has no {attr!r}; the plugin "
                f"{self.distribution or ''} is broken, report it to its authors"
            ) from e
        if not callable(fn):
            raise PluginError(f"query engine '{self.name}': {self.factory} is not callable")
        return fn
