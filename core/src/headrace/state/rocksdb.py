"""The RocksDB state store (``stateStore=rocksdb``, ``pip install 'headrace[rocksdb]'``), for
state larger than memory.

The working state is a RocksDB database (``<state>/rocksdb``, through ``rocksdict``): rows
under ``d<key>``, an event-time index under ``o<order><key>`` (8-byte big-endian, so evicting
by watermark is one range scan over the rows evicted; encodings in
:mod:`headrace.state.rocksdb_codec`: data only, nothing unpickled), and under ``mstate`` a JSON
object of whose state it is (query, operator, partition) and the version it holds (written in
the same atomic write batch as the commit). The first change of a batch marks the database
dirty in the same way, so a crash mid-batch is always detected. RocksDB's own write-ahead log
is off: after a crash the database is as of its last flush, whose ``mstate`` says what it holds.
A database (or checkpoint) whose ``mstate`` records other state, is not JSON, or is a pickle of
an earlier headrace is refused with ``CheckpointError``; one RocksDB cannot open is rebuilt.

Per batch the store reads and writes in key order (a batch's keys sorted by numpy, so each
memtable insert or block read lands next to the one before), one ``get`` per key (for keys
without values, a deduplication's, the memtable has a whole-key bloom filter, so a key not in
state costs no skiplist walk) and one write batch per call; evicting rows without values
reads nothing back, as the index entries it scans hold the whole row (key and order).

A ``put``'s rows (of a store with values) are held back in memory, as Arrow columns: while the
next batches get and put exactly the same keys (every batch of an open window, as a rule), the
get returns the held rows and the put replaces them, with no database read, write or
encoding; they are written in one write batch when anything else reads or changes the
database (other keys, a removal, an eviction that may reach them, a scan, a snapshot, the
close). Meanwhile the database lags the state, so a commit leaves its ``mstate`` as it is: a
clean older version (nothing written since; its changelogs restore it) or dirty (rebuilt from a
checkpoint). Held rows of the committed version are written with a clean ``mstate`` in the
same write batch.

A deduplication's new keys (``put(absent=True)`` of a store without values, keys of integer,
temporal and boolean columns) are held in memory likewise (:class:`HeldKeys`: a numpy key set
and event-time index): lookups check them first and ask the database only for the others (and
only when it has rows), the watermark evicts them from memory with no database write, and
they are written in one write batch only when their memory exceeds ``held_keys_bytes`` (the
writer option ``rocksdbHeldKeysMB``), at a snapshot and at the close.

Durability and versioning use the same changelog files as the memory backend; every
``snapshot_interval`` versions a RocksDB checkpoint (hard links to the immutable SST files,
cheap) is taken as ``snapshot/<version>.rocksdb``. To load version ``v`` the store uses the
working database as it is when it holds ``v``, replays the changelogs after its version when it
is clean and older, and otherwise rebuilds it from the newest checkpoint at or before ``v`` plus
the changelogs after that checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import CheckpointError, HeadraceError
from headrace.state.backends import DEFAULT_HELD_KEYS_MB
from headrace.state.heldkeys import HeldKeys
from headrace.state.keyindex import fixed_width_keys
from headrace.state.rocksdb_codec import (
    Damaged,
    check_encodings,
    dec_order,
    enc_order,
    key_codec,
    key_encoding,
    present,
    row_codec,
    row_encoding,
    rows_as_bytes,
)
from headrace.state.store import StateStore
from headrace.state.version_files import ORDER_COLUMN, list_versions, remove_quietly

__all__ = ["RocksDBStateStore"]

log = logging.getLogger(__name__)

_META = b"mstate"
_META_FORMAT = 1


class _Unopenable(CheckpointError):
    """RocksDB cannot open the database (damaged files): a working database is rebuilt from
    the verified changelogs and checkpoints; a checkpoint is refused."""


def _link_or_copy(src: str, dst: str) -> None:
    if src.endswith(".sst"):
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copy2(src, dst)


def _fixed_width_rows(dbkeys: list[bytes]) -> np.ndarray | None:
    """``dbkeys`` as a uint8 matrix (a row per key) when they are all of one length (at
    least 9 bytes: a prefix byte and 8 more), else None."""
    n, width = len(dbkeys), len(dbkeys[0]) if dbkeys else 0
    if width < 9:
        return None
    joined = b"".join(dbkeys)
    if len(joined) != n * width:
        return None
    return np.frombuffer(joined, np.uint8).reshape(n, width)


def _key_order_of_rows(rows: np.ndarray) -> np.ndarray | None:
    """:func:`_key_order` of keys given as a uint8 matrix (a row per key, at least 9 bytes):
    by their 8 bytes after the prefix byte, as one uint64 each (ties kept in their order)."""
    if len(rows) < 2:
        return None
    head = np.ascontiguousarray(rows[:, 1:9]).view(">u8").ravel().astype(np.uint64)
    perm = np.argsort(head, kind="stable")
    return None if bool((perm[1:] > perm[:-1]).all()) else perm


def _key_order(dbkeys: list[bytes]) -> np.ndarray | None:
    """The positions of ``dbkeys`` in ascending byte order, or nearly: the order is a hint
    for locality, never needed for correctness. Keys of one length (fixed-width keys) are
    sorted by their 8 bytes after the prefix byte (a ``d`` key's first key column, an ``o``
    key's order) as one uint64 each, ties kept in their order: about twice as fast as
    numpy's sort of the byte strings, which other keys get (keys differing only by trailing
    zero bytes may then come in either order). None for fewer than two keys or keys already
    in order (an aggregation's keys often are: nothing to permute)."""
    if len(dbkeys) < 2:
        return None
    rows = _fixed_width_rows(dbkeys)
    if rows is not None:
        return _key_order_of_rows(rows)
    perm = np.argsort(np.array(dbkeys, dtype=np.bytes_), kind="stable")  # O(n) on sorted runs
    return None if bool((perm[1:] > perm[:-1]).all()) else perm


def _permuted(items: list[bytes], perm: np.ndarray) -> list[bytes]:
    """``[items[i] for i in perm]``, by numpy (about twice as fast)."""
    arr = np.empty(len(items), object)
    arr[:] = items
    return arr[perm].tolist()


@dataclass
class _Held:
    """The rows of the last ``put`` of a store with values, not yet written to the database
    (:meth:`RocksDBStateStore._put`): the keys (as passed, and encoded), the values and orders
    put last, and what the database holds for these keys, against which the write is made."""

    keys: pa.Table
    values: pa.Table
    order: pa.Array  # int64, null: no order
    kbs: list[bytes]
    dks: list[bytes]
    perm: np.ndarray | None  # the database keys' order (_key_order)
    db_order: np.ndarray  # the order of each key's row in the database (0 where none)
    db_has: np.ndarray  # whether the database has an index entry for the key's row
    added: int  # keys the database has no row for (already counted in ``_rows``)

    def first_order(self) -> int | None:
        """The smallest order of the held rows, None when none has one."""
        if len(self.order) == self.order.null_count:
            return None
        return int(pc.min(self.order).as_py())


class RocksDBStateStore(StateStore):
    """State in a RocksDB database on local disk; see the module docstring."""

    backend = "rocksdb"

    def __init__(self, path: str, key_schema: pa.Schema, value_schema: pa.Schema, *,
                 held_keys_bytes: int | None = None, **kwargs: Any) -> None:  # fmt: skip
        """``held_keys_bytes``: the memory a store of keys without values (of integer, temporal
        and boolean columns) may hold new keys in, see :meth:`_hold_new_keys` (0: none are
        held; None: :data:`DEFAULT_HELD_KEYS_MB` MiB)."""
        cap = DEFAULT_HELD_KEYS_MB << 20 if held_keys_bytes is None else held_keys_bytes
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
            raise ValueError(f"held_keys_bytes must be a whole number of bytes, 0 or more, not {held_keys_bytes!r}")
        try:
            import rocksdict
        except ImportError:
            raise HeadraceError(
                "stateStore=rocksdb needs rocksdict, which is not installed; pip install 'headrace[rocksdb]'"
            ) from None
        self._rocksdict = rocksdict
        # the encodings, from the schemas (a key type no encoding takes is refused before any
        # I/O); the folder's metadata must record the same (checked in _check_stored_metadata)
        self._keys = key_codec(key_schema, key_encoding(key_schema))
        self._codec = row_codec(value_schema, row_encoding(value_schema))
        super().__init__(path, key_schema, value_schema, **kwargs)
        self._dbdir = os.path.join(self.path, "rocksdb")
        self._db: Any = None
        self._rows = 0
        self._db_version: int | None = None
        self._db_dirty = False
        self._last: tuple[pa.Table, tuple[list[bytes], list[Any], list[bytes], np.ndarray | None]] | None = None
        self._last_orders: tuple[pa.Table, np.ndarray, np.ndarray] | None = None
        # the last put's rows, held back from the database while the next batches put the same
        # keys (an open window's): see _put. Only for stores with values (not deduplications')
        self._held: _Held | None = None
        self._hold_puts = bool(len(value_schema))
        # new keys of a store without values (a deduplication's) held in memory, up to this
        # many bytes, see _hold_new_keys; ``_absent``: the keys of the put(absent=True) under way
        self._held_keys: HeldKeys | None = None
        self._held_keys_cap = cap if not len(value_schema) and fixed_width_keys(key_schema) else 0
        self._absent: pa.Table | None = None
        self._absent_prepared: tuple[pa.Table, Any] | None = None
        self._write_opts = self._rocksdict.WriteOptions()
        # no RocksDB write-ahead log: the changelog files are the durable record. A process
        # that dies loses the memtable, so the database reopens as of its last flush: a
        # consistent prefix of the write batches, whose ``mstate`` tells its version and
        # whether a batch was half-applied (then it is rebuilt from a checkpoint)
        self._write_opts.disable_wal = True  # type: ignore[method-assign,assignment]  # a property (stubs: a method)

    def _metadata_extra(self) -> dict[str, Any]:
        return {"rocksdbKeys": key_encoding(self.key_schema), "rocksdbRows": row_encoding(self.value_schema)}

    def _check_stored_metadata(self, meta: dict[str, Any]) -> None:
        check_encodings(meta, os.path.join(self.path, "metadata"), self.key_schema, self.value_schema)

    @contextlib.contextmanager
    def _decoding(self) -> Iterator[None]:
        """Entries of the database that do not decode are refused, naming the database."""
        try:
            yield
        except (Damaged, pa.ArrowException, ValueError, UnicodeDecodeError) as e:
            raise CheckpointError(
                f"state database {self._dbdir} holds an entry that does not decode as this state's keys and rows "
                f"({e}); it is damaged or was written by something else; delete the folder {self._dbdir} (it is "
                "rebuilt from the changelogs and checkpoints), or start the query over with a new checkpointLocation"
            ) from None

    # ------------------------------------------------------------------ database
    def _options(self) -> Any:
        rd = self._rocksdict
        opts = rd.Options(raw_mode=True)
        opts.create_if_missing(True)
        # point lookups dominate: bloom filters (a missing key costs no block read) and a block
        # cache holding index and filter blocks too (as Spark's RocksDB state store does)
        table = rd.BlockBasedOptions()
        table.set_bloom_filter(10, False)
        table.set_block_cache(rd.Cache(128 << 20))
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        opts.set_block_based_table_factory(table)
        if not len(self.value_schema):
            # keys without values (a deduplication's): most lookups are of new keys, and without
            # a whole-key bloom filter on the memtable each miss walks its skiplist (~2.5 µs;
            # ~0.3 µs with it). Not for stores with values (aggregations, joins), whose lookups
            # mostly hit: there the filter's probes and inserts cost ~15% of the query (CPU) and
            # more of its wall time. 2% of the write buffer: ~7 bits per entry of a full memtable
            opts.set_memtable_prefix_bloom_ratio(0.02)
            opts.set_memtable_whole_key_filtering(True)
        # LZ4 decompresses about twice as fast as the default Snappy (a block read that misses
        # the cache); files written with Snappy stay readable (the codec is per block)
        opts.set_compression_type(rd.DBCompressionType.lz4())
        return opts

    def _open(self, source: str | None = None) -> None:
        """Open the working database and read its ``mstate`` entry (``source``: the checkpoint
        it was copied from, for errors)."""
        self._close_db()
        try:
            self._db = self._rocksdict.Rdict(self._dbdir, self._options())
        except Exception as e:
            raise _Unopenable(
                f"state database {source or self._dbdir} cannot be opened ({e}); restore it, or use a new "
                "checkpointLocation"
            ) from None
        # blocks a flush writes go to the block cache too: the keys a batch touches are mostly
        # ones recent batches wrote (open windows), so a read after a flush (every snapshot
        # flushes) hits the cache instead of reading and decoding an SST block; the cost is
        # the flushed rows', not the state's. Not settable through rocksdict's Options.
        self._db.set_options({"block_based_table_factory": "{prepopulate_block_cache=kFlushOnly;}"})
        self._db.set_write_options(self._write_opts)
        raw = self._db.get(_META)
        if raw is None:
            self._db_version, self._db_dirty, self._rows = None, False, 0
        else:
            try:
                self._db_version, self._db_dirty, self._rows = self._read_meta(bytes(raw), source or self._dbdir)
            except CheckpointError:
                self._close_db()
                raise

    def _meta_doc(self, dirty: bool) -> dict[str, Any]:
        return {"format": _META_FORMAT, "query": self.query_id, "operator": self.operator_id,
                "partition": self.partition, "version": self._db_version, "dirty": dirty, "rows": self._rows}  # fmt: skip

    def _read_meta(self, raw: bytes, where: str) -> tuple[int | None, bool, int]:
        """(version, dirty, rows) of an ``mstate`` entry, checked: JSON of this store's
        identity (a database of another query, operator or partition is refused); never
        unpickled (earlier versions pickled it: refused, with the fix)."""
        fix = "restore it, or start the query over with a new checkpointLocation"
        if raw[:1] == b"\x80":  # a pickle (protocol 2 or later): what earlier versions wrote
            raise CheckpointError(
                f"state database {where} was written by an earlier headrace, which stored its state with Python's "
                "pickle (a format that can run code when read, so it is not read); start the query over with a new "
                "checkpointLocation"
            )
        try:
            doc = json.loads(raw)
        except ValueError as e:
            raise CheckpointError(f"state database {where} is damaged (its mstate entry is not JSON: {e}); {fix}") from None
        if not isinstance(doc, dict) or doc.get("format") != _META_FORMAT:
            raise CheckpointError(f"state database {where} is damaged (its mstate entry is {raw[:80]!r}); {fix}")
        version, dirty, rows = doc.get("version"), doc.get("dirty"), doc.get("rows")
        if (
            not (version is None or (isinstance(version, int) and not isinstance(version, bool) and version >= 0))
            or not isinstance(dirty, bool)
            or not isinstance(rows, int)
            or isinstance(rows, bool)
            or rows < 0
        ):
            raise CheckpointError(f"state database {where} is damaged (its mstate entry is {raw[:120]!r}); {fix}")
        mine = self._meta_doc(False)
        wrong = [f"{k} {doc.get(k)!r} (this state's: {mine[k]!r})" for k in ("query", "operator", "partition")
                 if doc.get(k) != mine[k]]  # fmt: skip
        if wrong:
            raise CheckpointError(
                f"state database {where} belongs to other state: it records {', '.join(wrong)}; it was copied or "
                f"swapped from another checkpoint or operator; put this state folder's own database back (or delete "
                f"{self._dbdir}: it is rebuilt from the changelogs), or start the query over with a new checkpointLocation"
            )
        return version, dirty, rows

    def _close_db(self) -> None:
        if self._db is not None:
            try:
                self._db.flush()  # without a write-ahead log the memtable is only kept by a flush
            except Exception as e:  # the changelogs are the record: the next open replays them
                log.warning("state database %s: flush before closing failed (%s)", self._dbdir, e)
            self._db.close()
            self._db = None

    def _meta(self, wb: Any, *, dirty: bool) -> None:
        wb.put(_META, json.dumps(self._meta_doc(dirty), separators=(",", ":")).encode())

    def _write(self, wb: Any) -> None:
        """Write ``wb`` atomically, marking the database dirty in the same write batch."""
        if not self._db_dirty:
            self._db_dirty = True
            self._meta(wb, dirty=True)
        self._db.write(wb)

    def _write_batch(self) -> Any:
        return self._rocksdict.WriteBatch(raw_mode=True)

    # ------------------------------------------------------------------ operations
    def __len__(self) -> int:
        return self._rows + (len(self._held_keys) if self._held_keys is not None else 0)

    def _lookup(self, keys: pa.Table) -> tuple[list[bytes], list[Any], list[bytes], np.ndarray | None]:
        """(encoded keys, their rows or None, their database keys, the database keys' order
        (:func:`_key_order`)), cached for the ``put`` of the same keys."""
        last = self._last
        if last is not None and last[0] is keys:
            return last[1]
        kbs = self._keys.encode(keys)
        dks = self._keys.data_keys(kbs)
        perm = _key_order(dks)
        found = (kbs, self._get_many(dks, perm), dks, perm)
        self._last = (keys, found)
        return found

    def _known_absent(self, keys: pa.Table) -> None:
        if self._held_keys_cap:
            self._absent = keys  # (held by the _put that follows)
            return
        n = keys.num_rows
        last = self._last
        if last is not None and last[0] is keys:  # the keys just looked up (all of them new)
            kbs, _, dks, perm = last[1]
        else:
            kbs = self._keys.encode(keys)
            dks = self._keys.data_keys(kbs)
            perm = _key_order(dks)
        self._last = (keys, (kbs, [None] * n, dks, perm))
        self._last_orders = (keys, np.zeros(n, np.int64), np.zeros(n, np.bool_))

    def _get_many(self, dks: list[bytes], perm: np.ndarray | None) -> list[Any]:
        """The values of database keys ``dks`` (None where absent), in their order, read in
        key order ``perm`` (a memtable or block read then follows the one before it: ~3x
        faster than in the batch's order) by one ``get`` each (faster than rocksdict's
        multi-get)."""
        if perm is None:
            return list(map(self._db.get, dks))
        got = list(map(self._db.get, _permuted(dks, perm)))
        out = np.empty(len(dks), object)
        out[perm] = got
        return out.tolist()

    @staticmethod
    def _put_sorted(
        wb: Any, dbkeys: list[bytes], values: list[bytes] | None = None, perm: np.ndarray | None = None
    ) -> None:
        """Add puts (``values``) or deletes (None) of ``dbkeys`` to ``wb`` in key order
        (``perm``, when known): the memtable then inserts each next to the one before it
        (several times faster than at random places of its skiplist)."""
        if perm is None:
            perm = _key_order(dbkeys)
        if perm is not None:
            dbkeys = _permuted(dbkeys, perm)
            if values is not None:
                values = _permuted(values, perm)
        if values is None:
            list(map(wb.delete, dbkeys))
        else:
            list(map(wb.put, dbkeys, values))

    @staticmethod
    def _put_index_entries(wb: Any, okeys: list[bytes], orders: np.ndarray) -> None:
        """Add puts of the event-time index entries ``okeys`` (``o<order><key>``, empty
        values) of rows of ``orders`` to ``wb``, in the order of ``orders`` (an int64 sort:
        key order up to ties, faster than sorting the keys' bytes; see :meth:`_put_sorted`)."""
        if len(okeys) > 1:
            perm = np.argsort(orders, kind="stable")
            if not bool((perm[1:] > perm[:-1]).all()):
                okeys = _permuted(okeys, perm)
        list(map(wb.put, okeys, repeat(b"", len(okeys))))

    def _holds(self, keys: pa.Table) -> _Held | None:
        """The held rows when they are of exactly ``keys`` (same rows, same order)."""
        held = self._held
        if held is not None and (held.keys is keys or held.keys.equals(keys)):
            return held
        return None

    def get(self, keys: pa.Table) -> tuple[pa.Table, np.ndarray]:
        if self._held_keys_cap:
            return self._get_keys(keys)
        held = self._holds(keys)
        if held is not None:  # the keys the last put wrote: their rows are the held ones
            self.work.rows_looked_up += keys.num_rows
            self._last = self._last_orders = None
            values = pa.Table.from_arrays(held.values.columns, schema=self.value_schema)
            return values, np.ones(keys.num_rows, np.bool_)
        self._write_held()
        raw = self._lookup(keys)[1]
        self.work.rows_looked_up += len(raw)
        found = present(raw)
        with self._decoding():
            ords, has, arrays = self._codec.decode(raw)
        self._last_orders = (keys, ords, has)
        return pa.Table.from_arrays(arrays, schema=self.value_schema), found

    def _get_keys(self, keys: pa.Table) -> tuple[pa.Table, np.ndarray]:
        """``get`` of a store whose new keys are held (:meth:`_hold_new_keys`): the keys are
        looked up among the held ones first (numpy), and in the database only those not held,
        and only when the database has rows."""
        n = keys.num_rows
        self.work.rows_looked_up += n
        self._last = self._last_orders = None
        held = self._held_keys
        if held is not None and len(held):
            prepared = held.prepare(keys)
            self._absent_prepared = (keys, prepared)  # (for the put of the new ones, when all are)
            found = held.lookup(prepared)
        else:
            self._absent_prepared = None
            found = np.zeros(n, np.bool_)
        if self._rows:
            miss = np.flatnonzero(~found)
            if len(miss):
                kbs = self._keys.encode(keys if len(miss) == n else keys.take(pa.array(miss)))
                dks = self._keys.data_keys(kbs)
                found[miss] = present(self._get_many(dks, _key_order(dks)))
        return pa.Table.from_arrays([], schema=self.value_schema), found

    def _hold_new_keys(self, keys: pa.Table, order: pa.Array) -> None:
        """``put(absent=True)`` of a store without values (a deduplication's new keys): the
        keys are held in memory (:class:`HeldKeys`), not written to the database. A held key
        that the watermark passes is evicted from memory (no database write at all); held keys
        are written to the database in one write batch when they use more than the cap
        (``held_keys_bytes``), at a snapshot and at the close. Meanwhile the database lags the
        state by them, so a commit leaves its ``mstate`` as it is (see
        :meth:`_commit_backend`); the changelogs stay the durable record."""
        held = self._held_keys
        if held is None:
            held = self._held_keys = HeldKeys(self.key_schema)
        cached, self._absent_prepared = self._absent_prepared, None
        held.add(cached[1] if cached is not None and cached[0] is keys else held.prepare(keys), order)
        if held.nbytes() > self._held_keys_cap:
            self._write_held_keys()

    def _keys_held(self) -> bool:
        """Whether new keys are held in memory (:meth:`_hold_new_keys`), not in the database."""
        return self._held_keys is not None and len(self._held_keys) > 0

    def _drop_held_keys(self) -> None:
        """Forget the held keys (their batches are restored from files instead)."""
        self._held_keys, self._absent, self._absent_prepared = None, None, None

    def _write_held_keys(self) -> None:
        """Write the held keys (if any) to the database in one write batch, and hold none
        (their memory is released). When the store has no uncommitted change, the database
        then holds exactly the committed version: its ``mstate`` says so in the same batch."""
        held, self._held_keys = self._held_keys, None
        self._absent_prepared = None
        if held is None or not len(held):
            return
        self._last = self._last_orders = None
        rows = held.all_rows()
        kbs = self._keys.encode(rows.select(self.key_schema.names))
        dks = self._keys.data_keys(kbs)
        n = len(kbs)
        values = pa.Table.from_arrays([], schema=self.value_schema)
        order = rows.column(ORDER_COLUMN).combine_chunks()
        wb = self._rows_batch(kbs, dks, _key_order(dks), np.zeros(n, np.int64), np.zeros(n, np.bool_), values, order)
        self._rows += n
        self._write_deferred(wb)

    def _write_deferred(self, wb: Any) -> None:
        """Write ``wb``, rows held back from the database until now: with a clean ``mstate``
        of the committed version when the store has no uncommitted change (the database then
        holds exactly that version), else as any write (marking the database dirty)."""
        if not self._dirty and self.version is not None:
            self._db_version = self.version if self.version >= 0 else None
            self._db_dirty = False
            self._meta(wb, dirty=False)
            self._db.write(wb)
        else:
            self._write(wb)

    def _put(self, keys: pa.Table, values: pa.Table, order: pa.Array) -> None:
        """Rows put are held back from the database (when the store has values and is not
        restoring): a later put of exactly the same keys (every batch of an open window, as a
        rule) replaces them in memory, and they are written in one write batch when anything
        else reads or changes the database (a get or put of other keys, a removal, an eviction
        that may reach them, a scan, a snapshot, the close). Until then the database lags the
        state, so a commit leaves its ``mstate`` as it is (a clean older version, whose
        changelogs then restore it, or dirty: rebuilt from a checkpoint), see
        :meth:`_commit_backend`."""
        if isinstance(order, pa.ChunkedArray):
            order = order.combine_chunks()
        absent, self._absent = self._absent, None
        if absent is not None and absent is keys:
            self._hold_new_keys(keys, order)
            return
        self._write_held_keys()  # (other puts: the keys may be held)
        hold = self._hold_puts and values.schema.types == self.value_schema.types
        held = self._holds(keys) if hold else None
        if held is not None:
            held.keys, held.values, held.order = keys, values, order
            self._last = self._last_orders = None
            return
        self._write_held()
        kbs, old, dks, perm = self._lookup(keys)
        self._last = None
        cached = self._last_orders
        self._last_orders = None
        if cached is not None and cached[0] is keys:
            old_o, old_has = cached[1], cached[2]
        else:
            with self._decoding():
                old_o, old_has = self._codec.orders(old)
        added = old.count(None)
        self._rows += added
        if hold:
            self._held = _Held(keys, values, order, kbs, dks, perm, old_o, old_has, added)
            return
        self._write(self._rows_batch(kbs, dks, perm, old_o, old_has, values, order))

    def _rows_batch(self, kbs: list[bytes], dks: list[bytes], perm: np.ndarray | None, old_o: np.ndarray,
                    old_has: np.ndarray, values: pa.Table, order: pa.Array) -> Any:  # fmt: skip
        """A write batch putting rows ``values`` (orders ``order``) under keys ``kbs`` (database
        keys ``dks``, in key order ``perm``) whose rows in the database have orders ``old_o``
        where ``old_has``, with the event-time index changed where a row's order does."""
        valid = order.is_valid().to_numpy(zero_copy_only=False) if order.null_count else None
        new_has = np.ones(len(order), np.bool_) if valid is None else valid
        new_o = order.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        # the event-time index changes only where a row's order does (a new row has none)
        changed = (old_has != new_has) | (old_has & new_has & (old_o != new_o))
        drop = np.flatnonzero(changed & old_has)
        add = np.flatnonzero(changed & new_has)
        wb = self._write_batch()
        self._put_sorted(wb, self._keys.order_keys(kbs, drop, old_o[drop]))
        self._put_index_entries(wb, self._keys.order_keys(kbs, add, new_o[add]), new_o[add])
        self._put_sorted(wb, dks, self._codec.encode(values, order), perm)
        return wb

    def _write_held(self) -> None:
        """Write the held rows (if any) to the database. When the store has no uncommitted
        change, the database then holds exactly the committed version: its ``mstate`` says so
        in the same write batch."""
        held, self._held = self._held, None
        if held is None:
            return
        self._last = self._last_orders = None
        self._write_deferred(
            self._rows_batch(held.kbs, held.dks, held.perm, held.db_order, held.db_has, held.values, held.order)
        )

    def _drop_held(self) -> None:
        """Forget the held rows (their batch is restored from files instead)."""
        held, self._held = self._held, None
        if held is not None:
            self._rows -= held.added

    def _remove(self, keys: pa.Table) -> int:
        self._write_held()
        self._write_held_keys()
        kbs, old, _, _ = self._lookup(keys)
        self._last = self._last_orders = None
        hit = present(old)
        rows = np.flatnonzero(hit)
        if not len(rows):
            return 0
        with self._decoding():
            ords, has = self._codec.orders([old[i] for i in rows.tolist()])
        wb = self._write_batch()
        hit_kbs = [kbs[i] for i in rows.tolist()]
        self._put_sorted(wb, self._keys.data_keys(hit_kbs))
        indexed = np.flatnonzero(has)
        self._put_sorted(wb, self._keys.order_keys(hit_kbs, indexed, ords[indexed]))
        self._rows -= len(rows)
        self._write(wb)
        return len(rows)

    def _decode_rows(self, kbs: list[bytes], raws: list[bytes]) -> pa.Table:
        with self._decoding():
            ords, has, varrays = self._codec.decode(list(raws))
            arrays = [*self._keys.decode(kbs), *varrays, pa.array(ords, pa.int64(), mask=~has)]
        return pa.Table.from_arrays(arrays, names=[*self.key_schema.names, *self.value_schema.names, ORDER_COLUMN])

    def earliest_order(self) -> int | None:
        """The first key of the event-time index (``o<order><key>``); when the database is
        not open (before a batch loads it), an eviction may be due."""
        if self._db is None:
            return -(2**63)
        # (a store holding new keys has no index entry in its database when it has no row there)
        first = self._first_indexed() if self._rows or not self._held_keys_cap else None
        for low in (self._held.first_order() if self._held is not None else None,
                    self._held_keys.earliest() if self._held_keys is not None else None):  # fmt: skip
            if low is not None:
                first = low if first is None else min(first, low)
        return first

    def _first_indexed(self) -> int | None:
        """The smallest order in the database's event-time index (one seek), None if empty."""
        it = self._db.iter()
        it.seek(b"o")
        k = it.key() if it.valid() else None
        del it
        if k is None or k[:1] != b"o":
            return None
        return dec_order(k[1:9])

    def _evict(self, upto: int) -> pa.Table:
        keys = self._held_keys
        if keys is None or not len(keys):
            return self._evict_db(upto)
        out = keys.pop_upto(upto)  # held keys leave memory: nothing is written
        self.work.rows_scanned += out.num_rows
        if self._rows:  # (a store holding new keys has no index entry in its database without a row there)
            out = pa.concat_tables([out, self._evict_db(upto)])
        return out

    def _evict_db(self, upto: int) -> pa.Table:
        """:meth:`_evict` of the rows in the database."""
        held = self._held
        if held is not None:
            # written first when the eviction may reach a held row, or an index entry of the
            # database (which may be a held key's older order)
            first = self._first_indexed()
            low = held.first_order()
            if (low is not None and low <= upto) or (first is not None and first <= upto):
                self._write_held()
        self._last = self._last_orders = None
        # the index keys up to ``upto``: one native iteration bounded by ``upper`` (no Python
        # call per key), then deleted as one range (iterating over many point tombstones would
        # cost every later seek of the index until a compaction drops them)
        upper = b"o" + enc_order(upto + 1) if upto < 2**63 - 1 else b"p"
        read_opt = self._rocksdict.ReadOptions()
        read_opt.set_iterate_upper_bound(upper)
        index_keys = list(self._db.keys(from_key=b"o", read_opt=read_opt))
        if not index_keys:
            return self._decode_rows([], [])
        if not len(self.value_schema):
            fixed = _fixed_width_rows(index_keys)
            if fixed is not None and fixed.shape[1] >= 17:  # (a key of 8 bytes or more)
                return self._evict_fixed_without_values(upper, fixed)
        kbs = [k[9:] for k in index_keys]
        dks = self._keys.data_keys(kbs)
        self.work.rows_scanned += len(kbs)
        wb = self._write_batch()
        wb.delete_range(b"o", upper)
        if not len(self.value_schema):
            # rows without values (a deduplication's keys): the index entry holds all of
            # the row (its key and order, which put and remove keep equal to its ``d`` row's),
            # so nothing is read back
            self._put_sorted(wb, dks)
            self._rows -= len(kbs)
            self._write(wb)
            biased = np.frombuffer(b"".join([k[1:9] for k in index_keys]), ">u8").astype(np.uint64)
            ords = (biased ^ np.uint64(1 << 63)).view(np.int64)
            with self._decoding():
                arrays = [*self._keys.decode(kbs), pa.array(ords, pa.int64())]
            return pa.Table.from_arrays(arrays, names=[*self.key_schema.names, ORDER_COLUMN])
        raw = self._get_many(dks, _key_order(dks))
        live = np.flatnonzero(present(raw)).tolist()
        if len(live) == len(raw):
            live_kbs, live_raw, live_dks = kbs, raw, dks
        else:
            live_kbs, live_raw, live_dks = [kbs[i] for i in live], [raw[i] for i in live], [dks[i] for i in live]
        self._put_sorted(wb, live_dks)
        self._rows -= len(live_kbs)
        self._write(wb)
        return self._decode_rows(live_kbs, live_raw)

    def _evict_fixed_without_values(self, upper: bytes, index: np.ndarray) -> pa.Table:
        """:meth:`_evict` of rows without values whose index entries are all of one length
        (fixed-width keys, a deduplication's), as one uint8 matrix (a row per entry
        ``o<order><key>``): the data keys ``d<key>`` built, put in key order and the orders
        decoded by numpy, with no Python code per row but the write batch's deletes."""
        n = len(index)
        self.work.rows_scanned += n
        wb = self._write_batch()
        wb.delete_range(b"o", upper)
        data = np.empty((n, index.shape[1] - 8), np.uint8)
        data[:, 0] = ord("d")
        data[:, 1:] = index[:, 9:]
        perm = _key_order_of_rows(data)
        list(map(wb.delete, rows_as_bytes(data if perm is None else data[perm])))
        self._rows -= n
        self._write(wb)
        biased = np.ascontiguousarray(index[:, 1:9]).view(">u8").ravel().astype(np.uint64)
        ords = (biased ^ np.uint64(1 << 63)).view(np.int64)
        with self._decoding():
            arrays = [
                *self._keys.decode(rows_as_bytes(np.ascontiguousarray(index[:, 9:]))),
                pa.array(ords, pa.int64()),
            ]
        return pa.Table.from_arrays(arrays, names=[*self.key_schema.names, ORDER_COLUMN])

    def scan(self) -> pa.Table:
        self._write_held()
        out = self._scan_db()
        if self._held_keys is not None and len(self._held_keys):
            out = pa.concat_tables([out, self._held_keys.all_rows()])
        return out

    def _scan_db(self) -> pa.Table:
        it = self._db.iter()
        it.seek(b"d")
        kbs, raws = [], []
        while it.valid():
            k = it.key()
            if k[:1] != b"d":
                break
            kbs.append(k[1:])
            raws.append(it.value())
            it.next()
        del it
        self.work.rows_scanned += len(kbs)
        return self._decode_rows(kbs, raws)

    def memory_used_bytes(self) -> int:
        if self._db is None:
            return 0
        total = self._held_keys.nbytes() if self._held_keys is not None else 0
        for prop in ("rocksdb.cur-size-all-mem-tables", "rocksdb.estimate-table-readers-mem", "rocksdb.block-cache-usage"):
            try:
                total += int(self._db.property_int_value(prop) or 0)
            except Exception:
                continue
        return total

    # ------------------------------------------------------------------ versions
    def _commit_backend(self, version: int) -> None:
        if self._held is not None or self._keys_held():
            # the database lags the state by the held rows or keys: its mstate stays as it is
            # (a clean older version, nothing having been written since, or dirty)
            return
        wb = self._write_batch()
        self._db_version = version
        self._db_dirty = False
        self._meta(wb, dirty=False)
        self._db.write(wb)

    def _snapshot_versions(self) -> list[int]:
        return list_versions(os.path.join(self.path, "snapshot"), ".rocksdb")

    def _snapshot(self, version: int) -> bool:
        """A RocksDB checkpoint of the working database (flushes the memtable, hard-links the
        SST files): ``snapshot/<version>.rocksdb``."""
        self._write_held()  # (the version is committed: the database then holds it, clean)
        self._write_held_keys()
        if self._db_dirty or self._db_version != version:  # (every write since was of committed batches)
            self._commit_backend(version)
        final = self.snapshot_path(version) + ".rocksdb"
        tmp = final + ".tmp"
        remove_quietly(tmp)
        remove_quietly(final)
        self._rocksdict.Checkpoint(self._db).create_checkpoint(tmp)
        os.replace(tmp, final)
        self.work.snapshots += 1
        return True

    def _restore(self, version: int) -> None:
        self._last = self._last_orders = None
        self._drop_held()
        self._drop_held_keys()
        if self._db is None:
            try:
                self._open()
            except _Unopenable:  # (a database of other state, or old or damaged entries: refused)
                self._db_version, self._db_dirty = None, True  # rebuilt below from verified files
        clean = self._db is not None and not self._db_dirty
        if version == -1 and clean and self._db_version is None and self._rows == 0:
            return
        paths: list[str] | None = None
        if clean and self._db_version is not None and self._db_version <= version:
            base = self._db_version
            try:
                paths = self._chain(base, version)
            except CheckpointError:  # changelogs after it retired: rebuild from a checkpoint instead
                paths = None
        if paths is None:
            snaps = [s for s in self._snapshot_versions() if s <= version]
            base = snaps[-1] if snaps else -1
            paths = self._chain(base, version)  # verify before discarding the working database
            self._close_db()
            remove_quietly(self._dbdir)
            if base >= 0:
                src = self.snapshot_path(base) + ".rocksdb"
                try:
                    shutil.copytree(src, self._dbdir, copy_function=_link_or_copy)
                except OSError as e:
                    raise CheckpointError(f"state snapshot {src} cannot be read ({e}); restore it or use a new "
                                          "checkpointLocation") from None  # fmt: skip
                self._open(source=src)
                if self._db_version != base:
                    raise CheckpointError(f"state snapshot {src} holds version {self._db_version}, not {base}; it is "
                                          "damaged; restore it or use a new checkpointLocation")  # fmt: skip
            else:
                self._open()
        self.version = base if base >= 0 else None
        self._hold_puts = False  # the restore's puts go to the database, which then holds the version
        try:
            for p in paths:
                self._apply_file(p)
        finally:
            self._hold_puts = bool(len(self.value_schema))
        wb = self._write_batch()
        self.version = version
        self._db_version = version if version >= 0 else None
        self._db_dirty = False
        self._meta(wb, dirty=False)
        self._db.write(wb)

    def settle(self) -> None:
        """As ``StateStore.settle``, and the held rows of the committed version written (the
        deferred work of an earlier batch, which a bench keeps out of the batches it times).
        Held keys stay held: most leave by eviction, which writes nothing."""
        super().settle()
        if self._held is not None and not self._dirty and self.version is not None:
            self._write_held()

    def close(self) -> None:
        super().close()
        holding = self._held is not None or self._keys_held()
        if holding and self._db is not None:
            if self._dirty or self.version is None:
                self._drop_held()  # (uncommitted: the changelogs restore what was committed)
                self._drop_held_keys()
            else:
                try:
                    self._write_held()  # the committed version, then flushed as a whole
                    self._write_held_keys()
                except Exception as e:  # the changelogs are the record: the next open replays them
                    log.warning("state database %s: writing its last rows before closing failed (%s)",
                                self._dbdir, e)  # fmt: skip
        self._close_db()
