"""The RocksDB state store (``stateStore=rocksdb``, ``pip install 'headrace[rocksdb]'``), for
state larger than memory.

The working state is a RocksDB database (``<state>/rocksdb``, through ``rocksdict``): rows
under ``d<key>``, an event-time index under ``o<order><key>`` (8-byte big-endian, so evicting
by watermark is one range scan over the rows evicted), and the version it holds under
``mstate`` (written in the same atomic write batch as the commit). The first change of a batch
marks the database dirty in the same way, so a crash mid-batch is always detected.

Durability and versioning use the same changelog files as the memory backend; every
``snapshot_interval`` versions a RocksDB checkpoint (hard links to the immutable SST files,
cheap) is taken as ``snapshot/<version>.rocksdb``. To load version ``v`` the store uses the
working database as it is when it holds ``v``, replays the changelogs after its version when it
is clean and older, and otherwise rebuilds it from the newest checkpoint at or before ``v`` plus
the changelogs after that checkpoint.
"""

from __future__ import annotations

import os
import pickle
import shutil
import struct
from typing import Any

import numpy as np
import pyarrow as pa

from headrace.errors import CheckpointError, HeadraceError
from headrace.state.columns import from_int64, key_hashables, to_int64
from headrace.state.files import ORDER_COLUMN, list_versions, remove_quietly
from headrace.state.store import StateStore

__all__ = ["RocksDBStateStore"]

_ORDER = struct.Struct(">Q")
_BIAS = 1 << 63
_META = b"mstate"


def _enc_order(o: int) -> bytes:
    return _ORDER.pack(o + _BIAS)


def _dec_order(b: bytes) -> int:
    return int(_ORDER.unpack(b)[0]) - _BIAS


def _py_columns(table: pa.Table) -> list[list[Any]]:
    out = []
    for c in table.columns:
        if pa.types.is_temporal(c.type):
            c = to_int64(c)
        numeric = pa.types.is_integer(c.type) or pa.types.is_floating(c.type)
        out.append(c.to_numpy().tolist() if numeric and c.null_count == 0 else c.to_pylist())
    return out


def _arrow(values: list[Any], type: pa.DataType) -> pa.Array:
    if pa.types.is_temporal(type):
        return from_int64(pa.array(values, pa.int64()), type)
    return pa.array(values, type=type)


def _link_or_copy(src: str, dst: str) -> None:
    if src.endswith(".sst"):
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copy2(src, dst)


def _fixed_width(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_temporal(t) or pa.types.is_boolean(t)


class _PickleCodec:
    """Rows as ``pickle((order, values))``: any value types."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema

    def encode(self, values: pa.Table, order: pa.Array) -> list[bytes]:
        vals = list(zip(*_py_columns(values), strict=True)) if values.num_columns else [()] * len(order)
        dumps = pickle.dumps
        return [dumps((o, v), 5) for o, v in zip(order.to_pylist(), vals, strict=True)]

    def order_of(self, raw: bytes) -> Any:
        return pickle.loads(raw)[0]

    def decode(self, raws: list[bytes | None]) -> tuple[list[Any], list[pa.Array]]:
        n = len(self.schema)
        missing = (None, (None,) * n)
        loads = pickle.loads
        decoded = [loads(r) if r is not None else missing for r in raws]
        cols: list[Any] = list(zip(*(d[1] for d in decoded), strict=True)) if decoded else [[] for _ in range(n)]
        arrays = [_arrow(list(c), f.type) for c, f in zip(cols, self.schema, strict=True)]
        return [d[0] for d in decoded], arrays


class _FixedCodec:
    """Rows of numbers, timestamps and booleans as fixed-width bytes, encoded and decoded by
    numpy for a whole batch at once (no Python work per value): the order (8 bytes) and its
    validity byte, then 8 bytes per value and a validity byte per value."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.k = len(schema)
        self.width = 9 + 9 * self.k
        self.blank = bytes(self.width)  # all nulls

    @staticmethod
    def _to_int64(col: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        t = col.type
        if pa.types.is_floating(t):
            a = col.cast(pa.float64())
        elif pa.types.is_boolean(t):
            a = col.cast(pa.int64())
        else:
            a = to_int64(col)
        valid = np.ones(len(a), np.uint8) if a.null_count == 0 else a.is_valid().to_numpy(zero_copy_only=False).astype(np.uint8)
        if a.null_count:
            a = a.fill_null(0)
        vals = np.ascontiguousarray(a.to_numpy(zero_copy_only=False))
        return vals.view(np.uint8).reshape(len(vals), 8), valid

    def encode(self, values: pa.Table, order: pa.Array) -> list[bytes]:
        n = len(order)
        buf = np.zeros((n, self.width), np.uint8)
        ob, ov = self._to_int64(order)
        buf[:, 0:8] = ob
        buf[:, 8] = ov
        for j, col in enumerate(values.columns):
            vb, vv = self._to_int64(col)
            buf[:, 9 + 8 * j : 17 + 8 * j] = vb
            buf[:, 9 + 8 * self.k + j] = vv
        return list(buf.view(f"V{self.width}").ravel().tolist())

    def order_of(self, raw: bytes) -> Any:
        return int.from_bytes(raw[0:8], "little", signed=True) if raw[8] else None

    def decode(self, raws: list[bytes | None]) -> tuple[list[Any], list[pa.Array]]:
        n = len(raws)
        blank = self.blank
        data = b"".join(r if r is not None else blank for r in raws)
        buf = np.frombuffer(data, np.uint8).reshape(n, self.width) if n else np.zeros((0, self.width), np.uint8)
        ords = np.ascontiguousarray(buf[:, 0:8]).view(np.int64).ravel()
        ovalid = buf[:, 8].astype(np.bool_)
        orders = [o if v else None for o, v in zip(ords.tolist(), ovalid.tolist(), strict=True)]
        arrays = []
        for j, f in enumerate(self.schema):
            raw = np.ascontiguousarray(buf[:, 9 + 8 * j : 17 + 8 * j])
            mask = ~buf[:, 9 + 8 * self.k + j].astype(np.bool_)
            m = mask if mask.any() else None
            t = f.type
            if pa.types.is_floating(t):
                arrays.append(pa.array(raw.view(np.float64).ravel(), pa.float64(), mask=m).cast(t))
            elif pa.types.is_boolean(t):
                arrays.append(pa.array(raw.view(np.int64).ravel() != 0, pa.bool_(), mask=m))
            else:
                ints = pa.array(raw.view(np.int64).ravel(), pa.int64(), mask=m)
                arrays.append(from_int64(ints, t) if not pa.types.is_int64(t) else ints)
        return orders, arrays


class RocksDBStateStore(StateStore):
    """State in a RocksDB database on local disk; see the module docstring."""

    backend = "rocksdb"

    def __init__(self, path: str, key_schema: pa.Schema, value_schema: pa.Schema, **kwargs: Any) -> None:
        try:
            import rocksdict
        except ImportError:
            raise HeadraceError(
                "stateStore=rocksdb needs rocksdict, which is not installed; pip install 'headrace[rocksdb]'"
            ) from None
        self._rocksdict = rocksdict
        super().__init__(path, key_schema, value_schema, **kwargs)
        self._dbdir = os.path.join(self.path, "rocksdb")
        self._db: Any = None
        self._rows = 0
        self._db_version: int | None = None
        self._db_dirty = False
        self._last: tuple[pa.Table, list[bytes], list[Any]] | None = None
        self._last_orders: tuple[pa.Table, list[Any]] | None = None
        fixed = all(_fixed_width(f.type) for f in value_schema)
        self._codec: _PickleCodec | _FixedCodec = _FixedCodec(value_schema) if fixed else _PickleCodec(value_schema)

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
        # LZ4 decompresses about twice as fast as the default Snappy (a block read that misses
        # the cache); files written with Snappy stay readable (the codec is per block)
        opts.set_compression_type(rd.DBCompressionType.lz4())
        return opts

    def _open(self, where: str | None = None) -> None:
        self._close_db()
        try:
            self._db = self._rocksdict.Rdict(where or self._dbdir, self._options())
        except Exception as e:
            raise CheckpointError(
                f"state database {where or self._dbdir} cannot be opened ({e}); restore it, or use a new "
                "checkpointLocation"
            ) from None
        # blocks a flush writes go to the block cache too: the keys a batch touches are mostly
        # ones recent batches wrote (open windows), so a read after a flush (every snapshot
        # flushes) hits the cache instead of reading and decoding an SST block; the cost is
        # the flushed rows', not the state's. Not settable through rocksdict's Options.
        self._db.set_options({"block_based_table_factory": "{prepopulate_block_cache=kFlushOnly;}"})
        raw = self._db.get(_META)
        if raw is None:
            self._db_version, self._db_dirty, self._rows = None, False, 0
        else:
            self._db_version, self._db_dirty, self._rows = pickle.loads(raw)

    def _close_db(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _meta(self, wb: Any, *, dirty: bool) -> None:
        wb.put(_META, pickle.dumps((self._db_version, dirty, self._rows)))

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
        return self._rows

    def _lookup(self, keys: pa.Table) -> tuple[list[bytes], list[Any]]:
        last = self._last
        if last is not None and last[0] is keys:
            return last[1], last[2]
        kbs = [pickle.dumps(k, 5) for k in key_hashables(keys)]
        get = self._db.get  # one call per key: faster than rocksdict's multi-get
        raw = [get(b"d" + k) for k in kbs]
        self._last = (keys, kbs, raw)
        return kbs, raw

    def get(self, keys: pa.Table) -> tuple[pa.Table, np.ndarray]:
        _, raw = self._lookup(keys)
        self.work.rows_looked_up += len(raw)
        found = np.fromiter((r is not None for r in raw), dtype=np.bool_, count=len(raw))
        orders, arrays = self._codec.decode(raw)
        self._last_orders = (keys, orders)
        return pa.Table.from_arrays(arrays, schema=self.value_schema), found

    def _put(self, keys: pa.Table, values: pa.Table, order: pa.Array) -> None:
        kbs, old = self._lookup(keys)
        self._last = None
        cached = self._last_orders
        self._last_orders = None
        old_orders = cached[1] if cached is not None and cached[0] is keys else None
        encoded = self._codec.encode(values, order)
        ords = order.to_pylist()
        order_of = self._codec.order_of
        wb = self._write_batch()
        added = 0
        for i, (kb, o_raw, v, o) in enumerate(zip(kbs, old, encoded, ords, strict=True)):
            if o_raw is None:
                added += 1
                if o is not None:
                    wb.put(b"o" + _enc_order(o) + kb, b"")
            else:
                old_o = old_orders[i] if old_orders is not None else order_of(o_raw)
                if old_o != o:
                    if old_o is not None:
                        wb.delete(b"o" + _enc_order(old_o) + kb)
                    if o is not None:
                        wb.put(b"o" + _enc_order(o) + kb, b"")
            wb.put(b"d" + kb, v)
        self._rows += added
        self._write(wb)

    def _remove(self, keys: pa.Table) -> int:
        kbs, old = self._lookup(keys)
        self._last = self._last_orders = None
        wb = self._write_batch()
        n = 0
        for kb, o_raw in zip(kbs, old, strict=True):
            if o_raw is None:
                continue
            n += 1
            o = self._codec.order_of(o_raw)
            wb.delete(b"d" + kb)
            if o is not None:
                wb.delete(b"o" + _enc_order(o) + kb)
        self._rows -= n
        if n:
            self._write(wb)
        return n

    def _decode_rows(self, items: list[tuple[bytes, bytes]]) -> pa.Table:
        nk = len(self.key_schema)
        kcols: list[list[Any]] = [[] for _ in range(nk)]
        for kb, _ in items:
            k = pickle.loads(kb)
            if nk == 1:
                kcols[0].append(k)
            else:
                for j in range(nk):
                    kcols[j].append(k[j])
        ords, varrays = self._codec.decode([raw for _, raw in items])
        arrays = [_arrow(c, f.type) for c, f in zip(kcols, self.key_schema, strict=True)]
        arrays += varrays
        arrays.append(pa.array(ords, pa.int64()))
        return pa.Table.from_arrays(arrays, names=[*self.key_schema.names, *self.value_schema.names, ORDER_COLUMN])

    def _evict(self, upto: int) -> pa.Table:
        self._last = self._last_orders = None
        it = self._db.iter()
        it.seek(b"o")
        end = _enc_order(upto)
        index_keys: list[bytes] = []
        while it.valid():
            k = it.key()
            if k[:1] != b"o" or k[1:9] > end:
                break
            index_keys.append(k)
            it.next()
        del it
        if not index_keys:
            return self._decode_rows([])
        kbs = [k[9:] for k in index_keys]
        get = self._db.get
        raw = [get(b"d" + kb) for kb in kbs]
        self.work.rows_scanned += len(kbs)
        wb = self._write_batch()
        items = []
        for ik, kb, r in zip(index_keys, kbs, raw, strict=True):
            wb.delete(ik)
            if r is not None:
                wb.delete(b"d" + kb)
                items.append((kb, r))
        self._rows -= len(items)
        self._write(wb)
        return self._decode_rows(items)

    def scan(self) -> pa.Table:
        it = self._db.iter()
        it.seek(b"d")
        items = []
        while it.valid():
            k = it.key()
            if k[:1] != b"d":
                break
            items.append((k[1:], it.value()))
            it.next()
        del it
        self.work.rows_scanned += len(items)
        return self._decode_rows(items)

    def memory_used_bytes(self) -> int:
        if self._db is None:
            return 0
        total = 0
        for prop in ("rocksdb.cur-size-all-mem-tables", "rocksdb.estimate-table-readers-mem", "rocksdb.block-cache-usage"):
            try:
                total += int(self._db.property_int_value(prop) or 0)
            except Exception:
                continue
        return total

    # ------------------------------------------------------------------ versions
    def _commit_backend(self, version: int) -> None:
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
        if self._db is None:
            try:
                self._open()
            except CheckpointError:
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
                self._open()
                if self._db_version != base:
                    raise CheckpointError(f"state snapshot {src} holds version {self._db_version}, not {base}; it is "
                                          "damaged; restore it or use a new checkpointLocation")  # fmt: skip
            else:
                self._open()
        self.version = base if base >= 0 else None
        for p in paths:
            self._apply_file(p)
        wb = self._write_batch()
        self.version = version
        self._db_version = version if version >= 0 else None
        self._db_dirty = False
        self._meta(wb, dirty=False)
        self._db.write(wb)

    def close(self) -> None:
        super().close()
        self._close_db()
