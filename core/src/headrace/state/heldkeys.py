"""``HeldKeys``: keys without values (a deduplication's) that the RocksDB store holds in memory
instead of writing them to its database, with the event time each is evicted by.

A deduplication puts nearly every key once and evicts it a few batches later, when the
watermark passes its event time: written to RocksDB, each key cost a ``d<key>`` put, an
``o<order><key>`` index put, their deletes and the lookups of every later batch. Held here,
a new key costs its share of a few numpy calls (the memory backend's numpy hash table,
:class:`headrace.state.keyindex.FixedKeyIndex`, and event-time index,
:class:`headrace.state.orderindex.OrderIndex`), and one evicted before it is ever written
costs the database nothing. The store bounds the memory (:meth:`HeldKeys.nbytes`): past its
cap it writes every held key to the database in one write batch and starts over empty.

Only keys of integer, temporal and boolean columns (``fixed_width_keys``) are held, each as
its columns' int64 values and null bits. Not thread-safe: the store's thread only. Nothing
here is durable: the store's changelogs are the record, and a restore starts without held
keys.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from headrace.state.columns import from_int64
from headrace.state.keyindex import FixedKeyIndex
from headrace.state.orderindex import OrderIndex
from headrace.state.version_files import ORDER_COLUMN

__all__ = ["HeldKeys"]


class HeldKeys:
    """A set of keys of ``key_schema`` (integer, temporal and boolean columns), each with an
    optional order (int64: the event time it is evicted by)."""

    def __init__(self, key_schema: pa.Schema, capacity: int = 1024) -> None:
        self.key_schema = key_schema
        self._index = FixedKeyIndex(len(key_schema))
        self._order = np.zeros(capacity, np.int64)
        self._has_order = np.zeros(capacity, np.bool_)
        self._free = np.zeros(capacity, np.int64)  # a stack of freed slots, reused first
        self._nfree = 0
        self._next = 0  # slots below it have been used
        self._events = OrderIndex(self._current_order, self._live_orders)

    def __len__(self) -> int:
        return len(self._index)

    def prepare(self, keys: pa.Table) -> Any:
        """``keys`` encoded for :meth:`lookup` and :meth:`add` (once for both)."""
        return self._index.prepare(keys)

    def lookup(self, prepared: Any) -> np.ndarray:
        """Which of the prepared keys are held (a boolean per key)."""
        if not len(self._index):
            return np.zeros(len(prepared.vals), np.bool_)
        return self._index.lookup(prepared) >= 0

    def add(self, prepared: Any, order: pa.Array) -> None:
        """Hold the prepared keys (none held, unique) with ``order`` (int64, null: never
        evicted)."""
        n = len(prepared.vals)
        if not n:
            return
        reuse = min(self._nfree, n)
        fresh = n - reuse
        self._grow(self._next + fresh)
        slots = np.concatenate([self._free[self._nfree - reuse : self._nfree][::-1],
                                np.arange(self._next, self._next + fresh, dtype=np.int64)])  # fmt: skip
        self._nfree -= reuse
        self._next += fresh
        self._index.insert(prepared, np.arange(n), slots)
        valid = order.is_valid().to_numpy(zero_copy_only=False) if order.null_count else None
        ords = (order.fill_null(0) if valid is not None else order).to_numpy(zero_copy_only=False)
        ords = ords.astype(np.int64, copy=False)
        self._order[slots] = ords
        self._has_order[slots] = True if valid is None else valid
        if valid is None:
            self._events.add(ords, slots)
        elif valid.any():
            self._events.add(ords[valid], slots[valid])

    def earliest(self) -> int | None:
        """The smallest order held (None when no held key has one)."""
        return self._events.earliest()

    def pop_upto(self, upto: int) -> pa.Table:
        """Remove the keys whose order is ``<= upto`` and return them (key columns and
        ``__order``). Costs the keys removed, not the keys held."""
        slots = self._events.pop_upto(upto)
        rows = self.rows(slots)
        if len(slots):
            self._index.remove(slots)
            self._has_order[slots] = False
            self._free[self._nfree : self._nfree + len(slots)] = slots
            self._nfree += len(slots)
        return rows

    def all_rows(self) -> pa.Table:
        """Every held key (key columns and ``__order``, null for none), in no particular order."""
        return self.rows(np.sort(self._index.live_slots()))

    def rows(self, slots: np.ndarray) -> pa.Table:
        """The keys at ``slots`` as a table of the key columns and ``__order``."""
        kd = self._index.key_rows(slots)
        k = len(self.key_schema)
        nulls = kd[:, k]
        cols = []
        for j, f in enumerate(self.key_schema):
            isnull = ((nulls >> j) & 1).astype(np.bool_)
            mask = isnull if isnull.any() else None
            vals = np.ascontiguousarray(kd[:, j])
            if pa.types.is_boolean(f.type):
                cols.append(pa.array(vals != 0, pa.bool_(), mask=mask))
            else:
                arr = pa.array(vals, pa.int64(), mask=mask)
                cols.append(arr if pa.types.is_int64(f.type) else from_int64(arr, f.type))
        has = self._has_order[slots]
        cols.append(pa.array(self._order[slots], pa.int64(), mask=None if has.all() else ~has))
        return pa.Table.from_arrays(cols, names=[*self.key_schema.names, ORDER_COLUMN])

    def nbytes(self) -> int:
        """The memory the held keys use (their hash table, keys, orders and event-time index)."""
        own = self._order.nbytes + self._has_order.nbytes + self._free.nbytes
        return int(self._index.nbytes() + self._events.nbytes() + own)

    # ------------------------------------------------------------------ internals
    def _grow(self, need: int) -> None:
        cap = len(self._order)
        if need <= cap:
            return
        cap = max(need, 2 * cap)
        for name in ("_order", "_has_order", "_free"):
            old = getattr(self, name)
            new = np.zeros(cap, old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    def _current_order(self, orders: np.ndarray, slots: np.ndarray) -> np.ndarray:
        # a slot's entry is made once per placement and taken out by pop_upto, which also frees
        # the slot: an entry found is the slot's only one, and holds while the slot has its order
        return self._has_order[slots] & (self._order[slots] == orders)

    def _live_orders(self) -> tuple[np.ndarray, np.ndarray]:
        slots = self._index.live_slots()
        slots = slots[self._has_order[slots]]
        return self._order[slots], slots
