"""Columns computed by numpy straight into reusable memory that Arrow arrays then share.

Each chunk's generated or computed int64 columns (the rate sources' values and timestamps,
``x % m`` in the Arrow fast path of SQL expressions) come from a pool rather than a fresh
allocation, because a fresh allocation costs either way:

* from glibc through numpy, the freed top of the heap is handed back to the kernel after a
  batch and faulted in again in the next one (~300 page faults a batch);
* from Arrow's memory pool, each allocation releases the GIL: on a busy query thread every
  release lets a background thread (checkpoint and state writers) take the GIL, and taking it
  back costs ~0.1 ms a column.

:func:`new_int64` hands out a slice of a pooled numpy array, wrapped as an Arrow buffer
without a copy. An array is reused only once nothing refers to it any more: the Arrow buffer
holds the slice, and the slice (like any numpy view of it) holds the array, so the array's
reference count says whether any array of any batch still uses its memory. Nothing is ever
overwritten while in use; a pool that is all in use gives new memory.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["SMALL_ROWS", "int64_array", "new_int64"]

SMALL_ROWS = 8192  # a column below 64 KiB is a small allocation for glibc (no trimming): plain numpy
POOL_ROWS = 65536  # pooled arrays hold this many int64 values (512 KiB)
POOL_MAX = 64  # pooled arrays at most (32 MiB); beyond, columns get Arrow's allocations

_POOL: list[np.ndarray] = []
_LOCK = threading.Lock()


def _free_refs() -> int:
    """The reference count of a pooled array nothing else refers to, as read in ``_take``."""
    probe = [np.empty(1, np.int64)]
    return sys.getrefcount(probe[0])


_FREE = _free_refs()


def _take(n: int) -> np.ndarray | None:
    """A writable view of ``n`` int64 values of a pooled array no one uses, or ``None``."""
    with _LOCK:  # the view is made before the lock is released: no two takers share an array
        for i in range(len(_POOL)):
            if sys.getrefcount(_POOL[i]) == _FREE:
                return _POOL[i][:n]
        if len(_POOL) < POOL_MAX:
            _POOL.append(np.empty(POOL_ROWS, np.int64))
            return _POOL[-1][:n]
    return None


def new_int64(n: int) -> tuple[pa.Buffer, Any]:
    """Memory for an int64 column of ``n`` values (uninitialised) as an Arrow buffer, and a
    writable numpy view of the same memory to compute the column into. Called per chunk, by
    any thread. The caller must not keep numpy views of it past building the column (the
    Arrow buffer alone keeps the memory in use)."""
    if n < SMALL_ROWS:
        arr = np.empty(n, dtype=np.int64)
        return pa.py_buffer(arr), arr
    view = _take(n) if n <= POOL_ROWS else None
    if view is not None:
        return pa.py_buffer(view), view
    buf = pa.allocate_buffer(n * 8)
    return buf, np.frombuffer(buf, dtype=np.int64)


def int64_array(buf: pa.Buffer, n: int) -> pa.Array:
    """The int64 column of :func:`new_int64`'s buffer, without nulls and without a copy."""
    return pa.Array.from_buffers(pa.int64(), n, [None, buf])
