"""The memory backend's key index: key -> slot of its row in the columnar storage.

Two implementations behind one interface (:func:`key_index` picks by the key schema):

- :class:`FixedKeyIndex` for keys made only of integer, temporal and boolean columns (window
  starts, ids, ...): a numpy open-addressing hash table (linear probing, load <= 1/2) over the
  keys as int64 columns. A batch's keys are hashed, probed and compared by whole-array numpy
  operations, so a lookup costs a few numpy calls per probe round instead of a Python dict
  access per key, and the table is flat arrays (no Python object per key for the cache or
  the garbage collector to walk).
- :class:`DictIndex` for any other key (strings, floats, lists): a Python dict from the key's
  hashable form (:func:`headrace.state.columns.packed_keys`) to its slot.

Both take the keys of one call in a *prepared* form (:meth:`prepare`), so that a ``get`` and
the ``put`` of the same keys that follows encode them once.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from headrace.state.columns import packed_keys, to_int64

__all__ = ["DictIndex", "FixedKeyIndex", "KeyIndex", "fixed_width_keys", "key_index"]

_EMPTY = -1
_TOMB = -2
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_SCALAR_TAIL = 24  # keys still probing below which a lookup finishes one key at a time


def fixed_width_keys(schema: pa.Schema) -> bool:
    """Keys whose every column is integer, temporal or boolean (int64 without loss)."""
    return len(schema) > 0 and all(
        pa.types.is_integer(f.type) or pa.types.is_temporal(f.type) or pa.types.is_boolean(f.type) for f in schema
    )


class KeyIndex(Protocol):
    """What the memory backend asks of an index."""

    def prepare(self, keys: pa.Table) -> Any:
        """The keys of one call, encoded for :meth:`lookup` and :meth:`insert`."""

    def lookup(self, prepared: Any) -> np.ndarray:
        """The slot of each key (int64), -1 where absent."""

    def insert(self, prepared: Any, rows: np.ndarray, slots: np.ndarray) -> None:
        """Add the keys at ``rows`` of ``prepared`` (absent, unique) with their ``slots``."""

    def remove(self, slots: np.ndarray) -> None:
        """Forget the keys at ``slots`` (present)."""

    def live_slots(self) -> np.ndarray:
        """Every slot in use, in no particular order."""

    def __len__(self) -> int: ...

    def nbytes(self) -> int: ...


def key_index(schema: pa.Schema) -> KeyIndex:
    """The index for keys of ``schema``."""
    return FixedKeyIndex(len(schema)) if fixed_width_keys(schema) else DictIndex()


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, in place on a uint64 array."""
    h ^= h >> _S30
    h *= _M1
    h ^= h >> _S27
    h *= _M2
    h ^= h >> _S31
    return h


class DictIndex:
    """Key -> slot in a Python dict, for keys of any type."""

    def __init__(self) -> None:
        self._d: dict[Any, int] = {}
        self._keys = np.full(1024, None, object)  # slot -> its key, to remove by slot

    def prepare(self, keys: pa.Table) -> list[Any]:
        return packed_keys(keys)

    def lookup(self, prepared: list[Any]) -> np.ndarray:
        get = self._d.get
        return np.fromiter((get(k, -1) for k in prepared), dtype=np.int64, count=len(prepared))

    def insert(self, prepared: list[Any], rows: np.ndarray, slots: np.ndarray) -> None:
        """Add the keys ``prepared[rows]`` (absent, unique) at ``slots``."""
        if len(slots) and int(slots.max()) >= len(self._keys):
            grown = np.full(max(int(slots.max()) + 1, 2 * len(self._keys)), None, object)
            grown[: len(self._keys)] = self._keys
            self._keys = grown
        d = self._d
        for i, s in zip(rows.tolist(), slots.tolist(), strict=True):
            k = prepared[i]
            d[k] = s
            self._keys[s] = k

    def remove(self, slots: np.ndarray) -> None:
        d = self._d
        for s in slots.tolist():
            del d[self._keys[s]]
        self._keys[slots] = None

    def live_slots(self) -> np.ndarray:
        return np.fromiter(self._d.values(), dtype=np.int64, count=len(self._d))

    def __len__(self) -> int:
        return len(self._d)

    def nbytes(self) -> int:
        return int(sys.getsizeof(self._d) + self._keys.nbytes + 64 * len(self._d))


class _Prepared:
    """A batch of keys for :class:`FixedKeyIndex`: their values and null bits, and their hash,
    computed on first use (a lookup answered by the index's memo needs none)."""

    __slots__ = ("_h", "_hash", "vals")

    def __init__(self, vals: np.ndarray, hash_fn: Callable[[np.ndarray], np.ndarray]) -> None:
        self.vals = vals
        self._hash = hash_fn
        self._h: np.ndarray | None = None

    @property
    def h(self) -> np.ndarray:
        if self._h is None:
            self._h = self._hash(self.vals)
        return self._h


class FixedKeyIndex:
    """Open-addressing hash table over keys of ``k`` int64-convertible columns (nulls allowed:
    a null compares equal to a null of the same column, as in the dict index)."""

    def __init__(self, k: int, capacity: int = 1024) -> None:
        self.k = k
        self._table = np.full(capacity, _EMPTY, np.int64)  # bucket -> slot, or empty / tombstone
        self._mask = capacity - 1
        # slot -> its key: the k values (0 where null), then the null bits (bit j: column j is null)
        self._kd = np.zeros((1024, k + 1), np.int64)
        self._bucket = np.zeros(1024, np.int64)  # slot -> its bucket, to remove by slot
        self._live = 0
        self._tombs = 0
        # the last lookup (keys, slots, updated by the insert of the same keys): a batch that
        # touches the same keys as the one before (an open window's keys) skips the hash and
        # the probing; forgotten when any key is removed
        self._memo: tuple[np.ndarray, np.ndarray] | None = None

    # ------------------------------------------------------------------ keys
    def prepare(self, keys: pa.Table) -> _Prepared:
        """Per row: the k values and the null bits (and, when needed, the hash)."""
        n = keys.num_rows
        vals = np.empty((n, self.k + 1), np.int64)
        nulls = vals[:, self.k]
        nulls[:] = 0
        for j, c in enumerate(keys.columns):
            if isinstance(c, pa.ChunkedArray):
                c = c.combine_chunks()
            a = c.cast(pa.int64()) if pa.types.is_boolean(c.type) else to_int64(c)
            if a.null_count:
                nulls |= (~a.is_valid().to_numpy(zero_copy_only=False)).astype(np.int64) << j
                a = a.fill_null(0)
            vals[:, j] = a.to_numpy(zero_copy_only=False)
        return _Prepared(vals, self._hash)

    def _hash(self, vals: np.ndarray) -> np.ndarray:
        h = vals[:, self.k].view(np.uint64) * _GOLD
        for j in range(self.k):
            h ^= vals[:, j].view(np.uint64)
            _mix(h)
        return h

    # ------------------------------------------------------------------ operations
    def lookup(self, prepared: _Prepared) -> np.ndarray:
        """The slot of each key, -1 where absent."""
        vals = prepared.vals
        memo = self._memo
        if memo is not None and memo[0].shape == vals.shape and np.array_equal(memo[0], vals):
            self._memo = (vals, memo[1])  # (the insert of these keys updates it)
            return memo[1].copy()
        out = self._lookup(prepared)
        self._memo = (vals, out.copy())
        return out

    def _lookup(self, prepared: _Prepared) -> np.ndarray:
        vals = prepared.vals
        n = len(vals)
        out = np.full(n, -1, np.int64)
        if not self._live or not n:
            return out
        h = prepared.h
        table, mask, kd = self._table, self._mask, self._kd
        idx = np.arange(n)
        pos = (h & np.uint64(mask)).astype(np.int64)
        # whole-array rounds while many keys are still probing (most find their bucket in the
        # first one or two), then the few long chains one key at a time
        while len(idx) > _SCALAR_TAIL:
            s = table[pos]
            held = np.flatnonzero(s >= 0)
            subset = 2 * len(held) < len(idx)
            if subset:  # mostly empty buckets (new keys: a deduplication's): compare the others only
                hs, hi = s[held], idx[held]
            else:  # kd[-1] and kd[-2] (empty, tombstone) are compared and discarded
                hs, hi = s, idx
            # np.take, not kd[s]: numpy's fancy indexing of rows is ~10x slower
            same = np.take(kd, hs, axis=0) == np.take(vals, hi, axis=0)
            eq = same[:, 0] if subset else same[:, 0] & (s >= 0)
            for j in range(1, self.k + 1):
                eq &= same[:, j]
            out[hi[eq]] = hs[eq]
            go = s != _EMPTY  # a different key or a tombstone: probe the next bucket
            go[held[eq] if subset else eq] = False
            idx = idx[go]
            pos = (pos[go] + 1) & mask
        for i, p in zip(idx.tolist(), pos.tolist(), strict=True):
            key = vals[i].tolist()
            while True:
                slot = int(table[p])
                if slot == _EMPTY:
                    break
                if slot >= 0 and kd[slot].tolist() == key:
                    out[i] = slot
                    break
                p = (p + 1) & mask
        return out

    def insert(self, prepared: _Prepared, rows: np.ndarray, slots: np.ndarray) -> None:
        """Add the keys at ``rows`` of ``prepared`` (absent, unique) with their ``slots``."""
        if not len(rows):
            return
        vals, h = prepared.vals, prepared.h
        memo = self._memo
        if memo is not None and memo[0] is vals:
            memo[1][rows] = slots
        else:
            self._memo = None
        self._ensure_slots(int(slots.max()) + 1)
        new_keys = vals if len(rows) == len(vals) else np.take(vals, rows, axis=0)  # (rows ascend: all of them)
        first = int(slots[0])
        if int(slots[-1]) - first == len(slots) - 1 and (len(slots) < 2 or bool((np.diff(slots) == 1).all())):
            self._kd[first : first + len(slots)] = new_keys  # fresh slots in a run: a slice, not a scatter
        else:
            for j in range(self.k + 1):  # column by column: a scatter of whole rows is ~15x slower
                self._kd[:, j][slots] = new_keys[:, j]
        if 2 * (self._live + self._tombs + len(rows)) > len(self._table):
            self._rehash(self._live + len(rows))
        self._place(slots, h[rows])
        self._live += len(rows)

    def _place(self, slots: np.ndarray, h: np.ndarray) -> None:
        table, mask = self._table, self._mask
        pos = (h & np.uint64(mask)).astype(np.int64)
        todo = slots
        while len(todo) > _SCALAR_TAIL:
            cur = table[pos]
            cand = np.flatnonzero(cur < 0)
            # of the keys aiming at the same free bucket, one takes it: every key writes its
            # slot there and the slot read back names the winner (no sort, unlike np.unique)
            pc, sc = pos[cand], todo[cand]
            table[pc] = sc
            won = table[pc] == sc
            take = cand[won]
            if self._tombs:
                self._tombs -= int(np.count_nonzero(cur[take] == _TOMB))
            self._bucket[todo[take]] = pos[take]
            left = np.ones(len(todo), np.bool_)
            left[take] = False
            todo = todo[left]
            pos = (pos[left] + 1) & mask
        for slot, p in zip(todo.tolist(), pos.tolist(), strict=True):  # the few long chains
            while table[p] >= 0:
                p = (p + 1) & mask
            if table[p] == _TOMB:
                self._tombs -= 1
            table[p] = slot
            self._bucket[slot] = p

    def _rehash(self, need: int) -> None:
        cap = 1024
        while cap < 4 * need:
            cap *= 2
        live = self._table[self._table >= 0]
        self._table = np.full(cap, _EMPTY, np.int64)
        self._mask = cap - 1
        self._tombs = 0
        if len(live):
            self._place(live, self._hash(np.take(self._kd, live, axis=0)))

    def _ensure_slots(self, need: int) -> None:
        cap = len(self._bucket)
        if need <= cap:
            return
        cap = max(need, 2 * cap)
        kd = np.zeros((cap, self.k + 1), np.int64)
        kd[: len(self._kd)] = self._kd
        bucket = np.zeros(cap, np.int64)
        bucket[: len(self._bucket)] = self._bucket
        self._kd, self._bucket = kd, bucket

    def remove(self, slots: np.ndarray) -> None:
        """Forget the keys at ``slots`` (present)."""
        if not len(slots):
            return
        self._memo = None
        self._table[self._bucket[slots]] = _TOMB
        self._live -= len(slots)
        self._tombs += len(slots)
        if self._tombs > len(self._table) // 4:
            self._rehash(self._live)

    def live_slots(self) -> np.ndarray:
        return self._table[self._table >= 0]

    def key_rows(self, slots: np.ndarray) -> np.ndarray:
        """The keys at ``slots`` (live), a row each: the k int64 values (0 where null), then
        the null bits (bit j: column j is null)."""
        return np.take(self._kd, slots, axis=0)

    def __len__(self) -> int:
        return self._live

    def nbytes(self) -> int:
        return int(self._table.nbytes + self._kd.nbytes + self._bucket.nbytes)
