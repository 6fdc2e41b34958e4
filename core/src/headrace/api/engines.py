"""The engine seam: how ``DataStreamWriter.start(path, engine=obj)`` hands a query definition
to another engine (Spark) without the api importing it.

An engine is a :class:`QueryEngine`: an object with ``start_query(writer, path)``. The user
passes one (``headrace.spark.engine.SparkEngine(spark, native={...})``), or an object some
engine accepts (a ``SparkSession``): the plugin registry's :class:`~headrace.plugins.EngineSpec`
whose ``accepts`` names the object's type builds the engine from it (the core registers its
Spark engine this way, in ``headrace._builtin``; a plugin may add others with the
``headrace_engines`` hook). The engine's module is imported only then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from headrace.errors import HeadraceError

if TYPE_CHECKING:
    from headrace.api.writer import DataStreamWriter

__all__ = ["QueryEngine", "query_engine"]


@runtime_checkable
class QueryEngine(Protocol):
    """Runs a query definition on another engine."""

    def start_query(self, writer: DataStreamWriter, path: str | None) -> Any:
        """Translate ``writer``'s frame, sink, trigger and options and start the query; return
        the engine's own query handle. Called once per ``start(path, engine=...)``, on the
        calling thread; everything the engine cannot run is refused (raised) before it starts."""
        ...


def query_engine(engine: object) -> QueryEngine:
    """``engine`` as a :class:`QueryEngine`: itself when it is one, else what the registered
    engine accepting its type makes of it. Raises :class:`HeadraceError` saying what
    ``engine=`` takes. Called once per ``start(engine=...)``."""
    if isinstance(engine, QueryEngine):
        return engine
    from headrace.plugins import registry

    spec = registry().engine_for(engine)
    made = spec.load_factory()(engine)
    if not isinstance(made, QueryEngine):
        raise HeadraceError(
            f"query engine '{spec.name}': {spec.factory} returned {type(made).__name__}, which has no "
            "start_query(writer, path); the plugin is broken, report it to its authors"
        )
    return made
