"""The in-memory state store (the default, ``stateStore=memory``).

The working state is a key index from key to slot (:mod:`headrace.state.keyindex`: a numpy
hash table for keys of integer, temporal and boolean columns, a dict otherwise) plus columnar
numpy storage per key and value column (:mod:`headrace.state.columns`); an event-time index
of sorted numpy runs of (order value, slot) (:mod:`headrace.state.orderindex`) makes eviction
by watermark a slice per run, costing the rows evicted. Durability comes from the changelog files written by :meth:`StateStore.commit`; once
at least ``snapshot_interval`` changelogs holding at least half as many rows as the state were
written since the last snapshot, a background thread writes a new one: from a copy of the
live rows taken at the commit when the state is small (up to ``COPY_SNAPSHOT_ROWS`` rows of
fixed-width columns: the copy costs the batch ~0.1 ms per 10k rows), otherwise by
consolidating the last snapshot and the changelogs since (files only: the working state is
not copied, so the batch does not wait for it).
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.state.columns import Column
from headrace.state.keyindex import key_index
from headrace.state.orderindex import OrderIndex
from headrace.state.store import PendingWrite, StateStore
from headrace.state.version_files import OP_COLUMN, OP_PUT, ORDER_COLUMN, write_state_file

__all__ = ["MemoryStateStore"]

log = logging.getLogger(__name__)

_INT64, _FLOAT64 = pa.int64(), pa.float64()


#: states up to this many rows are snapshotted from a copy of the working state (~0.1 ms per
#: 10k rows on the batch's thread) instead of by consolidating files (an Arrow group_by over
#: the changelogs since the last snapshot: ~15 ms of CPU for 100k changelog rows); above it,
#: the copy's memory and its pause on the batch's thread would grow with the state
COPY_SNAPSHOT_ROWS = 1 << 18


_SNAPSHOT_POOL: ThreadPoolExecutor | None = None
_SNAPSHOT_LOCK = threading.Lock()


def _snapshot_pool() -> ThreadPoolExecutor:
    """The threads that write snapshots, shared by the process's stores and kept between
    queries: starting a thread per snapshot cost the batch that started it up to tens of ms
    on a busy 2-core machine (``Thread.start`` waits until the new thread runs)."""
    global _SNAPSHOT_POOL
    with _SNAPSHOT_LOCK:
        if _SNAPSHOT_POOL is None:
            _SNAPSHOT_POOL = ThreadPoolExecutor(2, thread_name_prefix="headrace-state-snapshot")
        return _SNAPSHOT_POOL


def _forget_snapshot_pool() -> None:  # a forked child has none of the parent's threads
    global _SNAPSHOT_POOL
    _SNAPSHOT_POOL = None


os.register_at_fork(after_in_child=_forget_snapshot_pool)


class MemoryStateStore(StateStore):
    """State held in this process's memory; see the module docstring."""

    backend = "memory"
    snapshot_fraction = 0.5  # a snapshot rewrites the whole state: amortise it to the rows changed

    def __init__(self, path: str, key_schema: pa.Schema, value_schema: pa.Schema, **kwargs: Any) -> None:
        super().__init__(path, key_schema, value_schema, **kwargs)
        self._reset()
        self._bg: Future[None] | None = None  # the snapshot being written (on the shared snapshot threads)
        self._bg_error: BaseException | None = None

    # ------------------------------------------------------------------ working state
    def _reset(self, capacity: int = 1024) -> None:
        self._index = key_index(self.key_schema)
        self._keys = [Column(f.type, capacity) for f in self.key_schema]
        self._vals = [Column(f.type, capacity) for f in self.value_schema]
        self._order = np.zeros(capacity, np.int64)
        self._has_order = np.zeros(capacity, np.bool_)
        self._event_index = OrderIndex(self._current_order, self._live_orders)
        self._free = np.zeros(capacity, np.int64)  # a stack of freed slots, reused first
        self._mark = np.zeros(capacity, np.int64)  # scratch: one entry per slot (_current_order)
        self._nfree = 0
        self._next = 0
        self._capacity = capacity
        self._last: tuple[pa.Table, Any, np.ndarray] | None = None

    def _grow(self, need: int) -> None:
        if need <= self._capacity:
            return
        cap = max(need, self._capacity * 2)
        for c in (*self._keys, *self._vals):
            c.grow(cap)
        for name in ("_order", "_has_order", "_free", "_mark"):
            old = getattr(self, name)
            new = np.zeros(cap, old.dtype)
            new[: self._capacity] = old
            setattr(self, name, new)
        self._capacity = cap

    def __len__(self) -> int:
        return len(self._index)

    def _lookup(self, keys: pa.Table) -> tuple[Any, np.ndarray]:
        last = self._last
        if last is not None and last[0] is keys:
            return last[1], last[2]
        prepared = self._index.prepare(keys)
        slots = self._index.lookup(prepared)
        self._last = (keys, prepared, slots)
        return prepared, slots

    def get(self, keys: pa.Table) -> tuple[pa.Table, np.ndarray]:
        _, slots = self._lookup(keys)
        self.work.rows_looked_up += len(slots)
        found = slots >= 0
        safe = np.where(found, slots, 0)
        miss = ~found
        cols = [c.take(safe, miss) for c in self._vals]
        return pa.Table.from_arrays(cols, schema=self.value_schema), found

    def earliest_order(self) -> int | None:
        """The smallest order in the event-time index (possibly of a row removed since)."""
        return self._event_index.earliest()

    def add(self, keys: pa.Table, values: pa.Table, order: pa.Array | np.ndarray | None = None) -> pa.Table | None:
        """In the numpy columns, when every value column is int64 or float64 without nulls on
        either side: the keys that have a row are added to in place (gather, add, scatter per
        column: no Arrow copy out and back in; a batch that touches an open window's keys
        again), and keys without one get ``values`` as their row (a new window's keys), as
        :meth:`put` would write them; ``None`` otherwise, and ``None`` (with nothing changed)
        when an integer sum would leave int64's range: integer sums do not wrap, the caller's
        checked merge reports the overflow."""
        n = keys.num_rows
        if not n or values.num_rows != n or values.schema.types != self.value_schema.types:
            return None
        if not all(t in (_INT64, _FLOAT64) for t in self.value_schema.types) or any(
            c.null_count for c in values.columns
        ):
            return None
        _, slots = self._lookup(keys)
        present = slots >= 0
        everyone = bool(present.all())
        held = slots if everyone else slots[present]
        if len(held) and not all(c.valid[held].all() for c in self._vals):
            return None
        self.work.rows_looked_up += n
        order_arr = self._order_array(order, n)
        news = [(col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()).to_numpy(zero_copy_only=False)
                for col in values.columns]  # fmt: skip
        if not everyone:  # new keys: their rows are the batch's values (plus the old, where there are)
            sums = [v.copy() for v in news] if len(held) else news
            for c, total, v in zip(self._vals, sums, news, strict=True):
                if len(held):
                    old, new = c.data[held], v[present]
                    added = old + new
                    if c.data.dtype == np.int64 and _overflows(old, new, added):
                        return None
                    total[present] = added
            out = pa.Table.from_arrays([pa.array(t) for t in sums], schema=self.value_schema)
            self.put(keys, out, order_arr)
            return out
        totals = []
        for c, v in zip(self._vals, news, strict=True):  # every sum first: nothing is written if one overflows
            old = c.data[slots]
            total = old + v
            if c.data.dtype == np.int64 and _overflows(old, v, total):
                return None
            totals.append(total)
        arrays = []
        for c, total in zip(self._vals, totals, strict=True):
            c.data[slots] = total
            arrays.append(pa.array(total))
        self._last = None
        self._dirty = True
        self._set_order(slots, order_arr)
        out = pa.Table.from_arrays(arrays, schema=self.value_schema)
        self._log_put(keys, out, order_arr)
        return out

    def _known_absent(self, keys: pa.Table) -> None:
        """``put(absent=True)`` (a deduplication's new keys, just looked up): every key gets a
        new slot without probing the index again (the keys are a subset of those looked up,
        a different table, so the memo of the last lookup does not answer)."""
        last = self._last
        if last is not None and last[0] is keys:
            return
        self._last = (keys, self._index.prepare(keys), np.full(keys.num_rows, -1, np.int64))

    def _put(self, keys: pa.Table, values: pa.Table, order: pa.Array) -> None:
        prepared, slots = self._lookup(keys)
        self._last = None
        slots = slots.copy()
        new = np.flatnonzero(slots < 0)
        if len(new):
            n_reuse = min(self._nfree, len(new))
            fresh = len(new) - n_reuse
            self._grow(self._next + fresh)
            arr = np.concatenate([self._free[self._nfree - n_reuse : self._nfree][::-1],
                                  np.arange(self._next, self._next + fresh, dtype=np.int64)])  # fmt: skip
            self._nfree -= n_reuse
            self._next += fresh
            slots[new] = arr
            self._index.insert(prepared, new, arr)
            for c, col in zip(self._keys, keys.columns, strict=True):
                c.set(arr, col if len(new) == len(slots) else col.take(pa.array(new)))  # all new: no copy
        for c, col in zip(self._vals, values.columns, strict=True):
            c.set(slots, col)
        self._set_order(slots, order)

    def _set_order(self, slots: np.ndarray, order: pa.Array) -> None:
        if order.null_count == len(order):
            had = self._has_order[slots]
            if had.any():
                self._has_order[slots] = False
                self._event_index.stale(int(had.sum()))
            return
        valid = order.is_valid().to_numpy(zero_copy_only=False) if order.null_count else None
        ords = (order.fill_null(0) if valid is not None else order).to_numpy(zero_copy_only=False)
        ords = ords.astype(np.int64, copy=False)
        had = self._has_order[slots]
        if not had.any() and valid is None:  # new rows (the common case): index them all
            self._order[slots] = ords
            self._has_order[slots] = True
            self._event_index.add(ords, slots)
            return
        if valid is None:
            valid = np.ones(len(ords), np.bool_)
        changed = (had != valid) | (had & valid & (self._order[slots] != ords))
        if not changed.any():
            return
        cs = slots[changed]
        stale = int(had[changed].sum())
        self._order[cs] = ords[changed]
        self._has_order[cs] = valid[changed]
        add = valid[changed]
        self._event_index.add(ords[changed][add], cs[add])
        if stale:
            self._event_index.stale(stale)

    def _current_order(self, orders: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """Which ``(order, slot)`` entries of the event-time index still hold: the slot's order
        is that one, and the entry is the slot's last among ``slots`` (one per slot)."""
        ok = self._has_order[slots] & (self._order[slots] == orders)
        idx = np.flatnonzero(ok)
        held = slots[idx]
        self._mark[held] = idx  # the last entry of each slot wins
        ok[idx] = self._mark[held] == idx
        return ok

    def _live_orders(self) -> tuple[np.ndarray, np.ndarray]:
        slots = self._index.live_slots()
        slots = slots[self._has_order[slots]]
        return self._order[slots], slots

    def _free_slots(self, slots: np.ndarray) -> None:
        if not len(slots):
            return
        self._index.remove(slots)
        had = int(self._has_order[slots].sum())
        self._has_order[slots] = False
        if had:
            self._event_index.stale(had)  # (after: a rebuild it starts reads these slots as free)
        for c in (*self._keys, *self._vals):
            c.clear(slots)
        self._free[self._nfree : self._nfree + len(slots)] = slots
        self._nfree += len(slots)

    def _remove(self, keys: pa.Table) -> int:
        _, slots = self._lookup(keys)
        self._last = None
        hit = slots[slots >= 0]
        self._free_slots(hit)
        return len(hit)

    def _rows(self, slots: np.ndarray) -> pa.Table:
        cols = [c.take(slots) for c in (*self._keys, *self._vals)]
        has = self._has_order[slots]
        cols.append(pa.array(self._order[slots], pa.int64(), mask=~has if not has.all() else None))
        names = [*self.key_schema.names, *self.value_schema.names, ORDER_COLUMN]
        return pa.Table.from_arrays(cols, names=names)

    def _evict(self, upto: int) -> pa.Table:
        slots = self._event_index.pop_upto(upto)
        self.work.rows_scanned += len(slots)
        rows = self._rows(slots)
        self._last = None
        self._has_order[slots] = False  # (their index entries are gone: not stale)
        self._free_slots(slots)
        return rows

    def scan(self) -> pa.Table:
        slots = np.sort(self._index.live_slots())
        self.work.rows_scanned += len(slots)
        return self._rows(slots)

    def memory_used_bytes(self) -> int:
        cols = sum(c.nbytes() for c in (*self._keys, *self._vals))
        index = self._index.nbytes() + self._event_index.nbytes()
        return int(cols + index + self._order.nbytes + self._has_order.nbytes + self._free.nbytes)

    # ------------------------------------------------------------------ restore / snapshot
    def _restore(self, version: int) -> None:
        snaps = [s for s in self._snapshot_versions() if s <= version]
        self._reset()
        base = -1
        if snaps:
            base = snaps[-1]
            self._apply_file(self.snapshot_path(base))
        for p in self._chain(base, version):
            self._rows_since_snap += self._apply_file(p)
        self._last = None

    def _snapshot(self, version: int) -> bool:
        """Write ``snapshot/<version>`` on a background thread: for a state of up to
        :data:`COPY_SNAPSHOT_ROWS` rows of numbers, times and booleans from a copy of the
        working state's live rows (taken now: a numpy ``take`` per column), others by
        consolidating the newest
        earlier snapshot and the changelogs since (files in, file out: the batch copies
        nothing)."""
        if self._bg is not None:
            if not self._bg.done():
                return False  # still writing the previous one: tried again at the next commit
            self._bg = None
        if len(self) <= COPY_SNAPSHOT_ROWS and all(c.kind != "o" for c in (*self._keys, *self._vals)):
            rows = self._rows(self._index.live_slots())
            table = pa.Table.from_arrays([*rows.columns, pa.array(np.zeros(rows.num_rows, np.int8))],
                                         schema=self.file_schema)  # fmt: skip
            self._bg = _snapshot_pool().submit(self._write_copy, version, table)
        else:
            self._bg = _snapshot_pool().submit(self._run_snapshot, version, list(self._pending))
        return True

    def _write_copy(self, version: int, table: pa.Table) -> None:
        try:
            self._write_snapshot_file(version, table)
        except BaseException as e:  # a snapshot is an optimisation: the changelogs stay
            log.warning("state %s: snapshot of version %d failed: %s", self.path, version, e)
            self._bg_error = e

    def _write_snapshot_file(self, version: int, table: pa.Table) -> None:
        write_state_file(self.snapshot_path(version), self.file_schema, [table],
                         identity=self.file_identity("snapshot", version), durable=self.durable,
                         sync_dir=True)  # fmt: skip
        self.work.snapshots += 1
        self.work.snapshot_rows += table.num_rows

    def _run_snapshot(self, version: int, changelogs: list[PendingWrite]) -> None:
        try:  # the changelogs up to ``version`` are written first (commit(wait=False) leaves them pending)
            for w in changelogs:
                w.result()
        except BaseException as e:  # its batch failed: no snapshot of it
            log.warning("state %s: no snapshot of version %d, whose changelogs failed: %s", self.path, version, e)
            self._bg_error = e
            return
        self._write_snapshot(version)

    def _write_snapshot(self, version: int) -> None:
        try:
            snaps = [s for s in self._snapshot_versions() if s < version]
            base = snaps[-1] if snaps else -1
            tables = [self.read_file(self.snapshot_path(base))] if base >= 0 else []
            tables += [self.read_file(p) for p in self._chain(base, version)]
            self._write_snapshot_file(version, consolidate(tables, self.file_schema, self.key_schema.names))
        except BaseException as e:  # a snapshot is an optimisation: the changelogs stay
            log.warning("state %s: snapshot of version %d failed: %s", self.path, version, e)
            self._bg_error = e

    def _wait_background(self) -> None:
        if self._bg is not None:
            self._bg.result()  # the jobs catch their errors (a snapshot is an optimisation)
            self._bg = None


def _overflows(a: np.ndarray, b: np.ndarray, total: np.ndarray) -> bool:
    """Whether int64 ``total = a + b`` (numpy wraps) overflowed somewhere: the sum's sign
    differs from both addends' signs."""
    return bool((((a ^ total) & (b ^ total)) < 0).any())


def consolidate(tables: list[pa.Table], schema: pa.Schema, key_names: list[str]) -> pa.Table:
    """The last operation per key over ``tables`` (in order), keeping puts: a snapshot."""
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return schema.empty_table()
    t = pa.concat_tables(tables).combine_chunks()
    seq = pa.array(np.arange(t.num_rows, dtype=np.int64))
    t = t.append_column("__seq", seq)
    last = t.group_by(key_names, use_threads=False).aggregate([("__seq", "max")])
    idx = last.column("__seq_max")
    rows = t.take(idx.combine_chunks().sort())
    rows = rows.filter(pc.equal(rows.column(OP_COLUMN), OP_PUT))
    return rows.drop_columns(["__seq"]).cast(schema)
