"""The connector registry: plugins found through the ``headrace`` entry-point group (and
``HEADRACE_PLUGINS``), registered with pluggy, checked, and their connectors looked up by name.

:func:`registry` is the process-wide instance; entry points load lazily, on the first lookup
(once per process), under a lock. A plugin that fails to import is remembered and reported when
asked for; other plugins keep working.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import threading
import traceback
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pluggy

from headrace.errors import ConnectorNotFoundError, HeadraceError, PluginError
from headrace.options import suggest
from headrace.plugins.hookspecs import PLUGIN_API_VERSION, PLUGINS_ENV, HeadraceHookSpecs
from headrace.plugins.spec import ConnectorSpec, EngineSpec

__all__ = ["ENTRY_POINT_GROUP", "PLUGINS_ENV", "Registry", "register_listener", "registry", "unregister_listener"]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "headrace"
# connectors of the plugins published from headrace's own repository: an install hint names a
# distribution only for these, never one made up from the (maybe mistyped) name asked for
FIRST_PARTY = {
    "cloudfiles": "headrace-cloudfiles",
    "delta": "headrace-delta",
    "kafka": "headrace-kafka",
    "kinesis": "headrace-kinesis",
    "lakebase": "headrace-lakebase",
    "pubsub": "headrace-pubsub",
}
# PLUGINS_ENV (comma-separated plugin modules registered besides the entry points) is defined in hookspecs


@dataclass
class _Entry:
    spec: ConnectorSpec
    distribution: str


@dataclass
class _Broken:
    name: str
    distribution: str
    error: str
    trace: str = ""


def _major(version: str) -> str:
    return version.strip().split(".", 1)[0]


_HOOK_NAMES = ("headrace_connectors", "headrace_engines", "headrace_addhooks", "headrace_query_started",
               "headrace_query_progress", "headrace_query_terminated")  # fmt: skip


class Registry:
    """Installed connectors, found through the ``headrace`` entry-point group.

    Use :func:`registry` for the process-wide instance. ``register_module`` adds a plugin module
    by hand (tests, or an application's private connectors).
    """

    def __init__(self, *, load_entry_points: bool = True) -> None:
        self.pm = pluggy.PluginManager("headrace")
        self.pm.add_hookspecs(HeadraceHookSpecs)
        self.pm.hook.headrace_addhooks.call_historic(kwargs={"pluginmanager": self.pm})
        self._load_entry_points = load_entry_points
        self._loaded = False
        self._lock = threading.RLock()
        self._connectors: dict[str, _Entry] = {}
        self._duplicates: dict[str, list[str]] = {}
        self._broken: list[_Broken] = []
        self._problems: list[tuple[str, str, str]] = []
        self._refused: dict[str, _Broken] = {}
        self._engines: list[EngineSpec] = []

    # ------------------------------------------------------------------ loading
    def _ensure_loaded(self) -> None:
        with self._lock:
            if self._loaded:
                return
            self._loaded = True
            if self._load_entry_points:
                for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                    dist = ep.dist.name if ep.dist is not None else "?"
                    try:
                        module = ep.load()
                    except Exception as e:
                        self._broken.append(_Broken(ep.name, dist, f"{type(e).__name__}: {e}", traceback.format_exc()))
                        continue
                    self._register(module, dist, ep.name)
                    if dist == "headrace":
                        continue
                    self._check_hooks(module, dist, ep.name)
                # plugin modules named by the environment (a plugin tried before it is packaged,
                # or one test's connectors in the pipelines it runs in subprocesses)
                for mod_name in filter(None, (m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(","))):
                    try:
                        module = importlib.import_module(mod_name)
                    except Exception as e:
                        self._broken.append(_Broken(mod_name, PLUGINS_ENV, f"{type(e).__name__}: {e}", traceback.format_exc()))
                        continue
                    self._register(module, f"{PLUGINS_ENV}={mod_name}", mod_name)

    def register_module(self, module: ModuleType | object, distribution: str = "(registered by hand)") -> None:
        """Register a plugin module or object with ``@hookimpl`` functions."""
        self._ensure_loaded()
        with self._lock:
            self._register(module, distribution, getattr(module, "__name__", repr(module)))

    def _register(self, module: ModuleType | object, dist: str, name: str) -> None:
        try:
            self.pm.register(module, name=f"{dist}:{name}")
            hook = getattr(module, "headrace_connectors", None)
            specs = list(hook() or ()) if hook is not None else []
            engines_hook = getattr(module, "headrace_engines", None)
            engines = list(engines_hook() or ()) if engines_hook is not None else []
        except Exception as e:
            self._broken.append(_Broken(name, dist, f"{type(e).__name__}: {e}", traceback.format_exc()))
            return
        for engine in engines:
            if not isinstance(engine, EngineSpec):
                self._broken.append(_Broken(name, dist, f"headrace_engines() returned {type(engine).__name__}, "
                                                        "not an EngineSpec"))  # fmt: skip
                continue
            self._engines.append(EngineSpec(**{**engine.__dict__, "distribution": engine.distribution or dist}))
        for spec in specs:
            if not isinstance(spec, ConnectorSpec):
                self._broken.append(_Broken(name, dist, f"headrace_connectors() returned {type(spec).__name__}, "
                                                        "not a ConnectorSpec"))  # fmt: skip
                continue
            self._add(spec, dist, name)

    def _check_hooks(self, module: object, dist: str, name: str) -> None:
        """Report misspelled or undecorated hooks, and a plugin that provides no connector."""
        from headrace.options import suggest as _suggest

        for attr in dir(module):
            fn = getattr(module, attr, None)
            if not attr.startswith("headrace_") or not callable(fn) or isinstance(fn, type):
                continue
            if attr not in _HOOK_NAMES:
                hint = _suggest(attr, _HOOK_NAMES)
                self._problems.append((name, dist, f"{attr}() is not a headrace hook" + (f" (did you mean {hint}()?)" if hint else "")
                                       + f"; the hooks are {', '.join(_HOOK_NAMES)}"))  # fmt: skip
            elif self.pm.parse_hookimpl_opts(module, attr) is None:
                self._problems.append((name, dist, f"{attr}() is not decorated with @hookimpl "
                                                   "(from headrace.plugins import hookimpl), so headrace never calls it"))  # fmt: skip
        listener = any(
            self.pm.parse_hookimpl_opts(module, h) is not None for h in _HOOK_NAMES if h.startswith("headrace_query_")
        )
        provides_connectors = self.pm.parse_hookimpl_opts(module, "headrace_connectors") is not None
        provides_engines = self.pm.parse_hookimpl_opts(module, "headrace_engines") is not None
        # a listener plugin (metrics, tracing) or an engine plugin needs no connector; any other plugin does
        if (provides_connectors or not (listener or provides_engines)) and not any(
            e.distribution == dist for e in self._connectors.values()
        ) and not any(b.distribution == dist for b in self._broken):
            self._problems.append((name, dist, "registers no connector: its module has no @hookimpl "
                                               "headrace_connectors() returning ConnectorSpec(...) objects"))  # fmt: skip

    def _add(self, spec: ConnectorSpec, dist: str, plugin: str = "") -> None:
        spec = ConnectorSpec(**{**spec.__dict__, "distribution": spec.distribution or dist})
        if spec.api_version and _major(spec.api_version) != _major(PLUGIN_API_VERSION):
            self._broken.append(_Broken(
                plugin or spec.name, spec.distribution,
                f"connector '{spec.name}' of {spec.distribution} is written for headrace plugin API "
                f"{spec.api_version}, but this headrace implements plugin API {PLUGIN_API_VERSION}; fix: install a "
                f"version of {spec.distribution} made for this headrace, or a headrace for plugin API "
                f"{_major(spec.api_version)}.x",
            ))  # fmt: skip
            self._refused[spec.name.lower()] = self._broken[-1]
            return
        for key in {spec.name.lower(), *(a.lower() for a in spec.aliases)}:
            other = self._connectors.get(key)
            if other is not None and other.spec is not spec and other.distribution != dist:
                self._duplicates.setdefault(key, [other.distribution]).append(dist)
                continue
            self._connectors[key] = _Entry(spec, dist)

    # ------------------------------------------------------------------ lookup
    def get(self, name: str) -> ConnectorSpec:
        """The connector called ``name`` (case-insensitive; aliases too).

        Raises :class:`ConnectorNotFoundError` listing what is installed, with a suggestion, or
        :class:`PluginError` for a duplicate name or a plugin that failed to load.
        """
        self._ensure_loaded()
        key = name.lower()
        if key in self._duplicates:
            dists = " and ".join(sorted(set(self._duplicates[key])))
            raise PluginError(
                f"connector name '{name}' is provided by more than one distribution: {dists}; "
                "uninstall one of them (pip uninstall ...)"
            )
        entry = self._connectors.get(key)
        if entry is not None:
            return entry.spec
        if key in self._refused:
            raise PluginError(self._refused[key].error)
        for b in self._broken:
            # blamed by identity only: its entry-point name or its distribution's name
            if key in (b.name.lower(), b.distribution.lower(), b.distribution.lower().removeprefix("headrace-"),
                       b.distribution.lower().removeprefix("headrace_")):  # fmt: skip
                raise PluginError(
                    f"the plugin '{b.name}' from {b.distribution} failed to load, so connector '{name}' "
                    f"is unavailable: {b.error.splitlines()[0]}; fix: reinstall it (pip install --force-reinstall "
                    f"{b.distribution}), or run `headrace connectors -v` for the traceback"
                )
        for plugin, dist, problem in self._problems:
            if key in (plugin.lower(), dist.lower(), dist.lower().removeprefix("headrace-")):
                raise PluginError(f"connector '{name}' is unavailable: plugin '{plugin}' from {dist}: {problem}")
        names = self.names()
        hint = suggest(name, names)
        msg = f"no connector named '{name}'"
        if hint:
            msg += f" (did you mean '{hint}'?)"
        msg += f"; installed: {', '.join(names) or 'none'}"
        if self._broken:
            msg += f"; plugins that failed to load: {', '.join(f'{b.name} ({b.distribution})' for b in self._broken)}"
        first_party = FIRST_PARTY.get(name.lower())
        if first_party is not None:
            msg += f". The '{name}' connector comes with a plugin: pip install {first_party}"
        elif not hint:
            msg += ". Connectors are plugins: install the one that provides it, then `headrace connectors` lists it"
        raise ConnectorNotFoundError(msg)

    def names(self) -> list[str]:
        """Canonical names of the installed connectors, sorted."""
        self._ensure_loaded()
        return sorted({e.spec.name for e in self._connectors.values()}, key=str.lower)

    def specs(self) -> list[ConnectorSpec]:
        self._ensure_loaded()
        seen: dict[str, ConnectorSpec] = {}
        for e in self._connectors.values():
            seen.setdefault(e.spec.name, e.spec)
        return [seen[n] for n in sorted(seen, key=str.lower)]

    def broken(self) -> list[tuple[str, str, str]]:
        """Plugins that failed to load: (entry-point name, distribution, error)."""
        self._ensure_loaded()
        return [(b.name, b.distribution, b.error) for b in self._broken]

    def tracebacks(self) -> dict[tuple[str, str], str]:
        """The traceback of each plugin that failed to load, by (entry-point name, distribution)."""
        self._ensure_loaded()
        return {(b.name, b.distribution): b.trace for b in self._broken if b.trace}

    def problems(self) -> list[tuple[str, str, str]]:
        """Plugins that loaded but look wrong: (entry-point name, distribution, problem), e.g. a
        misspelled hook (``headrace_connector``) or no connector registered."""
        self._ensure_loaded()
        return list(self._problems)

    def engines(self) -> list[EngineSpec]:
        """The query engines plugins provide, in registration order."""
        self._ensure_loaded()
        return list(self._engines)

    def engine_for(self, obj: object) -> EngineSpec:
        """The query engine that accepts ``obj`` (``start(engine=obj)``): the first registered
        whose ``accepts`` names ``obj``'s type or a base of it. Raises :class:`HeadraceError`
        saying what ``engine=`` takes otherwise."""
        self._ensure_loaded()
        for spec in self._engines:
            if spec.takes(obj):
                return spec
        takes = " or ".join(e.description or e.name for e in self._engines) or "no engine (none is installed)"
        raise HeadraceError(
            f"start(engine={type(obj).__name__}): engine is {takes}, or an object with start_query(writer, path) "
            "(headrace.api.engines.QueryEngine); leave it out to run on headrace's own engine"
        )

    def duplicates(self) -> dict[str, list[str]]:
        self._ensure_loaded()
        return {k: sorted(set(v)) for k, v in self._duplicates.items()}

    @property
    def hook(self) -> Any:
        """The pluggy hook relay (``registry().hook.headrace_query_progress(progress=...)``)."""
        self._ensure_loaded()
        return self.pm.hook


_registry: Registry | None = None
_registry_lock = threading.Lock()


def registry() -> Registry:
    """The process-wide registry (created on first use; entry points load lazily)."""
    global _registry
    with _registry_lock:
        if _registry is None:
            _registry = Registry()
        return _registry


def register_listener(listener: object) -> None:
    """Register an object with ``headrace_query_*`` hookimpls as a query listener."""
    registry().pm.register(listener)


def unregister_listener(listener: object) -> None:
    registry().pm.unregister(listener)
