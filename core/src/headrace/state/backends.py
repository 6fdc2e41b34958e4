"""The names of the state store backends and the defaults of their options, in a module that
imports nothing heavy: the writer validates its ``stateStore`` and ``rocksdbHeldKeysMB``
options against them without loading numpy or a backend."""

from __future__ import annotations

__all__ = ["BACKENDS", "DEFAULT_HELD_KEYS_MB"]

BACKENDS = ("memory", "rocksdb")

#: the memory (MiB) a RocksDB store of keys without values (a deduplication's, keys of integer,
#: temporal and boolean columns) may hold new keys in before writing them to its database (the
#: writer option ``rocksdbHeldKeysMB``): ~130 bytes a key of one or two columns, so ~500k keys
DEFAULT_HELD_KEYS_MB = 64
