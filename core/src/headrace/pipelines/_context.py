"""Context variables linking definitions to the pipeline that loads or runs them.

``registering`` is set while a pipeline's source files are imported (the decorators register
into it); ``resolving`` installs the pipeline's resolver as the api's catalog
(:mod:`headrace.api.catalog`) while the runner (or the dry run) calls a definition, so that
``hr.read_stream.table(name)`` and ``dp.read.table(name)`` resolve pipeline datasets and the
graph learns its edges.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from headrace.api.catalog import active_catalog, installed
from headrace.errors import HeadraceError

if TYPE_CHECKING:
    from headrace.pipelines.elements import GraphRegistry

__all__ = ["active_registry", "active_resolver", "configuration", "registering", "resolving"]

_registry: ContextVar[GraphRegistry | None] = ContextVar("headrace_pipeline_registry", default=None)


def active_registry() -> GraphRegistry:
    """The registry definitions register into; an error outside a pipeline load."""
    reg = _registry.get()
    if reg is None:
        raise HeadraceError(
            "pipeline definitions (@dp.table, dp.create_sink, ...) register into a pipeline being "
            "loaded; run the file with `headrace pipelines run` (listed in pipeline.yml's libraries), "
            "or load it with headrace.pipelines.load_pipeline(...)"
        )
    return reg


@contextlib.contextmanager
def registering(reg: GraphRegistry) -> Iterator[GraphRegistry]:
    token = _registry.set(reg)
    try:
        yield reg
    finally:
        _registry.reset(token)


def active_resolver() -> Any:
    """The resolver of the pipeline calling a definition, or None outside one (the catalog the
    api sees: :func:`headrace.api.catalog.active_catalog`)."""
    return active_catalog()


@contextlib.contextmanager
def resolving(resolver: Any) -> Iterator[Any]:
    """Install ``resolver`` as the api's catalog while a definition is called."""
    with installed(resolver):
        yield resolver


_config: ContextVar[dict[str, str] | None] = ContextVar("headrace_pipeline_configuration", default=None)


def configuration() -> dict[str, str]:
    """The pipeline spec's ``configuration`` (strings), while its definitions load or run."""
    return dict(_config.get() or {})
