"""State stores for stateful stream operators (aggregations, deduplication), versioned by
batch id under ``<checkpoint>/state/<operator index>/``. See :mod:`headrace.state.store` for
the interface and guarantees, docs/transforms_state.md for the layout.

Nothing heavy is imported here: the backends load numpy/pyarrow (and rocksdict) when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from headrace.state.store import BACKENDS, PendingWrite, StateStore, WorkCounters, open_state_store

__all__ = ["BACKENDS", "PendingWrite", "StateStore", "WorkCounters", "open_state_store"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from headrace.state import store

        return getattr(store, name)
    raise AttributeError(f"module 'headrace.state' has no attribute {name!r}")
