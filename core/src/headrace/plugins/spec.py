"""``ConnectorSpec``: what a plugin says about one connector, and loading its classes lazily.

Specs are built once per process by a plugin's ``headrace_connectors`` hook (cheap: no client
library imported); ``load_source``/``load_sink`` import the ``"module:Class"`` paths once per
query start, after checking that the ``requires`` import names are installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from dataclasses import dataclass, field

from headrace.errors import PluginError
from headrace.options import OptionSchema

__all__ = ["ConnectorSpec"]

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
