"""How the RocksDB state store turns keys and rows into bytes and back.

Database keys: ``d<key>`` -> row, and ``o<order><key>`` -> empty (the event-time index; the
order is 8 bytes big-endian, biased so that negative values sort first). ``<key>`` is

- ``fixed`` (keys of integer, temporal and boolean columns, state written since this codec
  exists): per column 8 bytes big-endian with the sign bit flipped, then one validity byte
  per column; encoded and decoded by numpy for a whole batch;
- ``pickle`` (any other key, and every state written before): ``pickle.dumps`` of the key's
  hashable form (:func:`headrace.state.columns.key_hashables`).

The encoding a state folder uses is recorded in its ``metadata`` (``rocksdbKeys``; absent in
older folders, which means ``pickle``), so a checkpoint keeps the encoding it was written with.

Rows: numbers, timestamps and booleans as fixed-width bytes (:class:`FixedRows`), anything
else pickled (:class:`PickleRows`); both carry the row's order.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any

import numpy as np
import pyarrow as pa

from headrace.state.columns import from_int64, key_hashables, to_int64

__all__ = ["FixedKeys", "FixedRows", "PickleKeys", "PickleRows", "dec_order", "enc_order", "fixed_width", "key_codec",
           "row_codec"]  # fmt: skip

_ORDER = struct.Struct(">Q")
_BIAS = 1 << 63


def enc_order(o: int) -> bytes:
    return _ORDER.pack(o + _BIAS)


def dec_order(b: bytes) -> int:
    """The inverse of :func:`enc_order`."""
    return int(_ORDER.unpack(b)[0]) - _BIAS


def fixed_width(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_temporal(t) or pa.types.is_boolean(t)


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


def _int64_and_valid(col: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """An integer, temporal, boolean or floating column as 8-byte values (floats by their
    bits) and a validity mask."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    t = col.type
    if pa.types.is_floating(t):
        a = col.cast(pa.float64())
    elif pa.types.is_boolean(t):
        a = col.cast(pa.int64())
    else:
        a = to_int64(col)
    valid = np.ones(len(a), np.bool_) if a.null_count == 0 else a.is_valid().to_numpy(zero_copy_only=False)
    if a.null_count:
        a = a.fill_null(0)
    return np.ascontiguousarray(a.to_numpy(zero_copy_only=False)), valid


def _rows_as_bytes(buf: np.ndarray) -> list[bytes]:
    """Each row of a 2-D uint8 array as one ``bytes``."""
    return list(buf.view(f"V{buf.shape[1]}").ravel().tolist()) if len(buf) else []


# ---------------------------------------------------------------------------- keys
class PickleKeys:
    """Keys as ``pickle.dumps(hashable)``: any key type."""

    name = "pickle"

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema

    def encode(self, keys: pa.Table) -> list[bytes]:
        dumps = pickle.dumps
        return [dumps(k, 5) for k in key_hashables(keys)]

    def data_keys(self, kbs: list[bytes]) -> list[bytes]:
        return [b"d" + k for k in kbs]

    def order_keys(self, kbs: list[bytes], rows: np.ndarray, orders: np.ndarray) -> list[bytes]:
        return [b"o" + enc_order(o) + kbs[i] for i, o in zip(rows.tolist(), orders.tolist(), strict=True)]

    def decode(self, kbs: list[bytes]) -> list[pa.Array]:
        nk = len(self.schema)
        cols: list[list[Any]] = [[] for _ in range(nk)]
        loads = pickle.loads
        for kb in kbs:
            k = loads(kb)
            if nk == 1:
                cols[0].append(k)
            else:
                for j in range(nk):
                    cols[j].append(k[j])
        return [_arrow(c, f.type) for c, f in zip(cols, self.schema, strict=True)]


class FixedKeys:
    """Keys of integer, temporal and boolean columns as 9 bytes per column, by numpy."""

    name = "fixed"

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.k = len(schema)
        self.width = 9 * self.k

    def _matrix(self, keys: pa.Table) -> np.ndarray:
        n = keys.num_rows
        buf = np.empty((n, self.width), np.uint8)
        for j, col in enumerate(keys.columns):
            vals, valid = _int64_and_valid(col)
            be = (vals.view(np.uint64) ^ np.uint64(_BIAS)).astype(">u8")
            buf[:, 8 * j : 8 * j + 8] = be.view(np.uint8).reshape(n, 8)
            buf[:, 8 * self.k + j] = valid
        return buf

    def encode(self, keys: pa.Table) -> list[bytes]:
        return _rows_as_bytes(self._matrix(keys))

    def _from_bytes(self, kbs: list[bytes]) -> np.ndarray:
        return np.frombuffer(b"".join(kbs), np.uint8).reshape(len(kbs), self.width)

    def data_keys(self, kbs: list[bytes]) -> list[bytes]:
        if not kbs:
            return []
        buf = np.empty((len(kbs), 1 + self.width), np.uint8)
        buf[:, 0] = ord("d")
        buf[:, 1:] = self._from_bytes(kbs)
        return _rows_as_bytes(buf)

    def order_keys(self, kbs: list[bytes], rows: np.ndarray, orders: np.ndarray) -> list[bytes]:
        if not len(rows):
            return []
        n = len(rows)
        buf = np.empty((n, 9 + self.width), np.uint8)
        buf[:, 0] = ord("o")
        be = (orders.astype(np.int64).view(np.uint64) ^ np.uint64(_BIAS)).astype(">u8")
        buf[:, 1:9] = be.view(np.uint8).reshape(n, 8)
        buf[:, 9:] = self._from_bytes([kbs[i] for i in rows.tolist()])
        return _rows_as_bytes(buf)

    def decode(self, kbs: list[bytes]) -> list[pa.Array]:
        buf = self._from_bytes(kbs) if kbs else np.zeros((0, self.width), np.uint8)
        out = []
        for j, f in enumerate(self.schema):
            be = np.ascontiguousarray(buf[:, 8 * j : 8 * j + 8]).view(">u8").ravel()
            ints = (be.astype(np.uint64) ^ np.uint64(_BIAS)).view(np.int64)
            valid = buf[:, 8 * self.k + j].astype(np.bool_)
            mask = ~valid if not valid.all() else None
            t = f.type
            if pa.types.is_boolean(t):
                out.append(pa.array(ints != 0, pa.bool_(), mask=mask))
            else:
                arr = pa.array(ints, pa.int64(), mask=mask)
                out.append(arr if pa.types.is_int64(t) else from_int64(arr, t))
        return out


def key_codec(schema: pa.Schema, name: str) -> PickleKeys | FixedKeys:
    """The key codec ``name`` (``fixed`` or ``pickle``) for ``schema``."""
    return FixedKeys(schema) if name == "fixed" else PickleKeys(schema)


# ---------------------------------------------------------------------------- rows
class PickleRows:
    """Rows as ``pickle((order, values))``: any value types."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema

    def encode(self, values: pa.Table, order: pa.Array) -> list[bytes]:
        vals = list(zip(*_py_columns(values), strict=True)) if values.num_columns else [()] * len(order)
        dumps = pickle.dumps
        return [dumps((o, v), 5) for o, v in zip(order.to_pylist(), vals, strict=True)]

    def orders(self, raws: list[bytes | None]) -> tuple[np.ndarray, np.ndarray]:
        """Each row's order (0 where none) and whether it has one (False for a missing row)."""
        loads = pickle.loads
        ords = [loads(r)[0] if r is not None else None for r in raws]
        valid = np.fromiter((o is not None for o in ords), np.bool_, count=len(ords))
        return np.fromiter((o or 0 for o in ords), np.int64, count=len(ords)), valid

    def decode(self, raws: list[bytes | None]) -> tuple[np.ndarray, np.ndarray, list[pa.Array]]:
        """(orders, which have one, value arrays) of ``raws`` (``None``: a missing row, nulls)."""
        n = len(self.schema)
        missing = (None, (None,) * n)
        loads = pickle.loads
        decoded = [loads(r) if r is not None else missing for r in raws]
        cols: list[Any] = list(zip(*(d[1] for d in decoded), strict=True)) if decoded else [[] for _ in range(n)]
        arrays = [_arrow(list(c), f.type) for c, f in zip(cols, self.schema, strict=True)]
        valid = np.fromiter((d[0] is not None for d in decoded), np.bool_, count=len(decoded))
        ords = np.fromiter((d[0] or 0 for d in decoded), np.int64, count=len(decoded))
        return ords, valid, arrays


class FixedRows:
    """Rows of numbers, timestamps and booleans as fixed-width bytes, encoded and decoded by
    numpy for a whole batch at once: the order (8 bytes) and its validity byte, then 8 bytes
    per value and a validity byte per value."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.k = len(schema)
        self.width = 9 + 9 * self.k
        self.blank = bytes(self.width)  # all nulls

    def encode(self, values: pa.Table, order: pa.Array) -> list[bytes]:
        n = len(order)
        buf = np.zeros((n, self.width), np.uint8)
        ob, ov = _int64_and_valid(order)
        buf[:, 0:8] = ob.view(np.uint8).reshape(n, 8)
        buf[:, 8] = ov
        for j, col in enumerate(values.columns):
            vb, vv = _int64_and_valid(col)
            buf[:, 9 + 8 * j : 17 + 8 * j] = vb.view(np.uint8).reshape(n, 8)
            buf[:, 9 + 8 * self.k + j] = vv
        return _rows_as_bytes(buf)

    def _matrix(self, raws: list[bytes | None]) -> np.ndarray:
        n = len(raws)
        if not n:
            return np.zeros((0, self.width), np.uint8)
        blank = self.blank
        data = b"".join(r if r is not None else blank for r in raws)
        return np.frombuffer(data, np.uint8).reshape(n, self.width)

    def orders(self, raws: list[bytes | None]) -> tuple[np.ndarray, np.ndarray]:
        buf = self._matrix(raws)
        return np.ascontiguousarray(buf[:, 0:8]).view(np.int64).ravel(), buf[:, 8].astype(np.bool_)

    def decode(self, raws: list[bytes | None]) -> tuple[np.ndarray, np.ndarray, list[pa.Array]]:
        buf = self._matrix(raws)
        ords = np.ascontiguousarray(buf[:, 0:8]).view(np.int64).ravel()
        ovalid = buf[:, 8].astype(np.bool_)
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
        return ords, ovalid, arrays


def row_codec(schema: pa.Schema) -> PickleRows | FixedRows:
    """The row codec for values of ``schema``."""
    return FixedRows(schema) if all(fixed_width(f.type) for f in schema) else PickleRows(schema)
