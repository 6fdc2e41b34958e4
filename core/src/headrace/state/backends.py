"""The names of the state store backends, in a module that imports nothing heavy: the writer
validates its ``stateStore`` option against them without loading numpy or a backend."""

from __future__ import annotations

__all__ = ["BACKENDS"]

BACKENDS = ("memory", "rocksdb")
