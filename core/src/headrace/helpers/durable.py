"""Durable files and state for connectors (the plugin SDK's names for the storage layer).

- :func:`atomic_write`: write a file so that a crash leaves the old content or the new, never
  a torn one (implemented in :mod:`headrace.checkpoint`).
- :func:`open_state_store`: a connector's own keyed state under its checkpoint folder
  (implemented in :mod:`headrace.state`).

Re-exports only: importing this module loads the checkpoint package; the state store's
backends load when :func:`open_state_store` is called.
"""

from __future__ import annotations

from typing import Any

from headrace.checkpoint import atomic_write

__all__ = ["atomic_write", "open_state_store"]


def open_state_store(*args: Any, **kwargs: Any) -> Any:
    """:func:`headrace.state.open_state_store`, imported when first called (same arguments).
    Called by a connector when it opens its own state, once per start, on the engine's thread."""
    from headrace.state import open_state_store as _open

    return _open(*args, **kwargs)
