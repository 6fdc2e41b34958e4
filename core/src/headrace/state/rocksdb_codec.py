"""How the RocksDB state store turns keys and rows into bytes and back.

Every encoding here is data only: fixed-width numbers, lengths and raw bytes, decoded by numpy
and Arrow; nothing read from the database is decoded by a format that can run code (the
state folder is as trusted as whoever can write the checkpoint).

Database keys: ``d<key>`` -> row, and ``o<order><key>`` -> empty (the event-time index; the
order is 8 bytes big-endian, biased so that negative values sort first, so evicting by
watermark is one range scan). ``<key>`` is

- ``fixed`` (keys of integer, temporal and boolean columns): per column 8 bytes big-endian
  with the sign bit flipped, then one validity byte per column; encoded and decoded by numpy
  for a whole batch;
- ``typed`` (any other key): per column a validity byte and the value's bytes in the
  column's :class:`_Col` encoding (8 bytes for numbers and times, floats with ``-0.0`` and NaN
  made canonical, a 4-byte length and the bytes for strings and binaries, the storage bytes
  for decimals and fixed-size binaries), built and parsed by numpy for a whole batch. The
  same key always gives the same bytes. Nested, map and other key types are refused (the
  memory backend cannot key them either, and Spark cannot group by a map).

Rows: numbers, timestamps and booleans as fixed-width bytes (:class:`FixedRows`), anything
else typed (:class:`TypedRows`: the same column encodings, nested values as JSON of their
storage values); both carry the row's order. The encodings a state folder uses are recorded
in its ``metadata`` (``rocksdbKeys``, ``rocksdbRows``); a folder written with the pickle
encodings of earlier versions (no ``rocksdbRows``, or ``rocksdbKeys: pickle``) is refused,
never unpickled (see :func:`check_encodings`).
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Sequence
from itertools import repeat
from operator import is_not
from typing import Any, cast

import numpy as np
import pyarrow as pa

from headrace.errors import CheckpointError, UnsupportedError
from headrace.state.columns import from_int64, to_int64

__all__ = ["Damaged", "FixedKeys", "FixedRows", "TypedKeys", "TypedRows", "check_encodings", "dec_order", "enc_order",
           "fill_missing", "fixed_width", "key_codec", "key_encoding", "present", "row_codec", "row_encoding",
           "rows_as_bytes"]  # fmt: skip

_ORDER = struct.Struct(">Q")
_BIAS = 1 << 63
_U8 = np.uint8


def enc_order(o: int) -> bytes:
    return _ORDER.pack(o + _BIAS)


def dec_order(b: bytes) -> int:
    """The inverse of :func:`enc_order`."""
    return int(_ORDER.unpack(b)[0]) - _BIAS


def fixed_width(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_temporal(t) or pa.types.is_boolean(t)


class Damaged(Exception):
    """Bytes that do not parse as the encoding says (raised while decoding, reported by the
    store as a ``CheckpointError`` naming its database)."""


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


def rows_as_bytes(buf: np.ndarray) -> list[bytes]:
    """Each row of a 2-D uint8 array as one ``bytes``."""
    return list(buf.view(f"V{buf.shape[1]}").ravel().tolist()) if len(buf) else []


def _bitmap(valid: np.ndarray) -> pa.Buffer | None:
    return None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))


def _gather(buf: np.ndarray, starts: np.ndarray, lens: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The bytes ``buf[starts[i] : starts[i] + lens[i]]`` of every i, concatenated; each must
    end by ``ends[i]`` (its entry's end), else ``Damaged``."""
    if len(lens) and bool((starts + lens > ends).any()):
        raise Damaged("a value runs past the end of its entry")
    total = int(lens.sum())
    if not total:
        return np.zeros(0, _U8)
    first = np.cumsum(lens) - lens
    return buf[np.repeat(starts - first, lens) + np.arange(total)]


# ---------------------------------------------------------------------------- columns
class _Col:
    """One column's typed encoding: per row a validity byte (0 null, 1 value) then the value.

    ``encode`` returns (segment lengths, concatenated segments) for a whole column;
    ``decode`` reads the column at byte positions ``pos`` of a joined buffer and returns
    (the array, the positions after it)."""

    def __init__(self, type: pa.DataType, *, key: bool) -> None:
        self.type = type
        self.key = key
        t = type
        if pa.types.is_dictionary(t):
            t = t.value_type
        if pa.types.is_string_view(t):
            t = pa.string()
        elif pa.types.is_binary_view(t):
            t = pa.binary()
        self.storage = t  # the type the bytes are of (cast to it and back)
        if fixed_width(t):
            self.kind, self.width = "num", 8
        elif pa.types.is_decimal(t) or pa.types.is_fixed_size_binary(t):
            self.kind, self.width = "raw", t.byte_width
        elif pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
            self.kind, self.width = "var", 0
        elif pa.types.is_null(t):
            self.kind, self.width = "null", 0
        elif key:
            raise UnsupportedError(
                f"the RocksDB state store cannot key state by a column of type {type}; group or deduplicate by "
                "columns of numbers, times, strings, binaries or decimals (for example a field of the struct, or "
                "the list cast to a string)"
            )
        else:
            self.kind, self.width = "json", 0
            self.json_type = _json_storage(t)
        # a null, as encode writes it
        self.blank = bytes({"num": 9, "raw": 1 + self.width, "var": 5, "json": 5, "null": 1}[self.kind])

    def _prepare(self, col: pa.Array | pa.ChunkedArray) -> pa.Array:
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        if col.type != self.storage:
            col = col.cast(self.storage)
        return col

    def encode(self, col: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
        arr = self._prepare(col)
        n = len(arr)
        if self.kind == "null":
            return np.ones(n, np.int64), np.zeros(n, _U8)
        valid = np.ones(n, np.bool_) if arr.null_count == 0 else arr.is_valid().to_numpy(zero_copy_only=False)
        if self.kind == "num":
            vals, _ = _int64_and_valid(arr)
            if self.key and pa.types.is_floating(self.storage):  # a key: equal floats, equal bytes
                f = vals.view(np.float64).copy()
                f[f == 0.0] = 0.0
                f[np.isnan(f)] = np.nan
                vals = f.view(np.int64)
            vals = np.where(valid, vals, 0)
            m = np.empty((n, 9), _U8)
            m[:, 0] = valid
            m[:, 1:] = (vals.view(np.uint64) ^ np.uint64(_BIAS)).astype(">u8").view(_U8).reshape(n, 8)
            return np.full(n, 9, np.int64), m.ravel()
        if self.kind == "raw":
            w = self.width
            data = np.frombuffer(arr.buffers()[1], _U8)[arr.offset * w : (arr.offset + n) * w].reshape(n, w)
            m = np.zeros((n, 1 + w), _U8)
            m[:, 0] = valid
            m[valid, 1:] = data[valid]  # a null's bytes are whatever Arrow left: zeros instead
            return np.full(n, 1 + w, np.int64), m.ravel()
        if self.kind == "var":
            if arr.null_count:
                arr = arr.fill_null(b"" if pa.types.is_binary(self.storage) or pa.types.is_large_binary(self.storage) else "")
            off_t = np.int64 if (pa.types.is_large_string(self.storage) or pa.types.is_large_binary(self.storage)) else np.int32
            offs = np.frombuffer(arr.buffers()[1], off_t)[arr.offset : arr.offset + n + 1].astype(np.int64)
            data = np.frombuffer(arr.buffers()[2], _U8) if arr.buffers()[2] is not None else np.zeros(0, _U8)
            lens = offs[1:] - offs[:-1]
            if n and int(lens.max()) >= 1 << 32:
                raise UnsupportedError(f"a state value of {int(lens.max())} bytes is too large (4 GiB at most)")
            seg = lens + 5
            out = np.empty(int(seg.sum()), _U8)
            starts = np.cumsum(seg) - seg
            out[starts] = valid
            hdr = lens.astype(">u4").view(_U8).reshape(n, 4)
            for b in range(4):
                out[starts + 1 + b] = hdr[:, b]
            body = np.repeat(starts + 5 - offs[:-1], lens) + np.arange(int(offs[0]), int(offs[-1]))
            out[body] = data[int(offs[0]) : int(offs[-1])]
            return seg, out
        # json: nested values, one JSON text per row (data only: parsed by json, typed by Arrow)
        if n and arr.null_count == n:  # all null (an optional nested column mostly unused)
            return np.full(n, 5, np.int64), np.zeros(5 * n, _U8)
        texts = [b"" if v is None else _json_bytes(v, self.json_type) for v in arr.cast(self.json_type).to_pylist()]
        lens = np.fromiter(map(len, texts), np.int64, count=n)
        parts = []
        for v, t in zip(valid.tolist(), texts, strict=True):
            parts.append((b"\x01" if v else b"\x00") + struct.pack(">I", len(t)) + t)
        joined = b"".join(parts)
        return lens + 5, np.frombuffer(joined, _U8)

    def decode(self, buf: np.ndarray, pos: np.ndarray, ends: np.ndarray) -> tuple[pa.Array, np.ndarray]:
        n = len(pos)
        if n and bool((pos >= ends).any()):
            raise Damaged("an entry ends before its last column")
        valid = buf[pos].astype(np.bool_) if n else np.zeros(0, np.bool_)
        if self.kind == "null":
            return pa.nulls(n, self.type), pos + 1
        if self.kind in ("num", "raw"):
            w = self.width
            raw = _gather(buf, pos + 1, np.full(n, w, np.int64), ends).reshape(n, w)
            if self.kind == "num":
                ints = (np.ascontiguousarray(raw).view(">u8").ravel().astype(np.uint64) ^ np.uint64(_BIAS)).view(np.int64)
                mask = ~valid if not valid.all() else None
                t = self.storage
                if pa.types.is_floating(t):
                    arr = pa.array(ints.view(np.float64), pa.float64(), mask=mask).cast(t)
                elif pa.types.is_boolean(t):
                    arr = pa.array(ints != 0, pa.bool_(), mask=mask)
                else:
                    a = pa.array(ints, pa.int64(), mask=mask)
                    arr = a if pa.types.is_int64(t) else from_int64(a, t)
            else:
                arr = pa.Array.from_buffers(self.storage, n, [_bitmap(valid), pa.py_buffer(np.ascontiguousarray(raw))])
            return self._back(arr), pos + 1 + w
        hdr = _gather(buf, pos + 1, np.full(n, 4, np.int64), ends).reshape(n, 4)
        lens = np.ascontiguousarray(hdr).view(">u4").ravel().astype(np.int64)
        body = _gather(buf, pos + 5, lens, ends)
        after = pos + 5 + lens
        if self.kind == "var":
            large = pa.types.is_large_string(self.storage) or pa.types.is_large_binary(self.storage)
            offs = np.zeros(n + 1, np.int64 if large else np.int32)
            np.cumsum(lens, out=offs[1:])
            arr = pa.Array.from_buffers(self.storage, n, [_bitmap(valid), pa.py_buffer(offs), pa.py_buffer(body)])
            try:
                arr.validate(full=True)  # UTF-8 of strings, offsets
            except pa.ArrowInvalid as e:
                raise Damaged(str(e)) from None
            return self._back(arr), after
        if not valid.any():
            return self._back(pa.nulls(n, self.json_type)), after
        texts = body.tobytes()
        vals: list[Any] = []
        at = 0
        for ok, ln in zip(valid.tolist(), lens.tolist(), strict=True):
            text = texts[at : at + ln]
            at += ln
            vals.append(_json_value(json.loads(text), self.json_type) if ok else None)
        try:
            arr = pa.array(vals, self.json_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
            raise Damaged(str(e)) from None
        return self._back(arr), after

    def _back(self, arr: pa.Array) -> pa.Array:
        return arr if arr.type == self.type else arr.cast(self.type)


def _json_storage(t: pa.DataType) -> pa.DataType:
    """``t`` with times as their integers and decimals as strings: a type whose Python values
    are JSON values (bytes aside, see :func:`_json_bytes`) and that casts back to ``t``."""
    if pa.types.is_temporal(t):
        return pa.int32() if t.bit_width == 32 else pa.int64()
    if pa.types.is_decimal(t):
        return pa.string()
    if pa.types.is_dictionary(t):
        return _json_storage(t.value_type)
    if pa.types.is_large_list(t):
        return pa.large_list(_json_storage(t.value_type))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(_json_storage(t.value_type), t.list_size)
    if pa.types.is_map(t):
        return pa.map_(_json_storage(t.key_type), _json_storage(t.item_type))
    if pa.types.is_list(t):
        return pa.list_(_json_storage(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _json_storage(f.type), f.nullable) for f in t])
    return t


def _binaryish(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)


def _to_json(v: Any, t: pa.DataType) -> Any:
    if v is None:
        return None
    if _binaryish(t):
        return base64.b64encode(v).decode()
    if pa.types.is_map(t):
        return [[_to_json(k, t.key_type), _to_json(x, t.item_type)] for k, x in v]
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return [_to_json(x, t.value_type) for x in v]
    if pa.types.is_struct(t):
        return [_to_json(v[f.name], f.type) for f in t]  # by position: field names may repeat
    return v


def _json_value(v: Any, t: pa.DataType) -> Any:
    """The inverse of :func:`_to_json` (raises ``Damaged`` for a value of the wrong shape)."""
    if v is None:
        return None
    try:
        if _binaryish(t):
            return base64.b64decode(v, validate=True)
        if pa.types.is_map(t):
            return [(_json_value(k, t.key_type), _json_value(x, t.item_type)) for k, x in v]
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            return [_json_value(x, t.value_type) for x in v]
        if pa.types.is_struct(t):
            if len(v) != t.num_fields:
                raise Damaged(f"a struct of {len(v)} fields, not {t.num_fields}")
            return {f.name: _json_value(x, f.type) for f, x in zip(t, v, strict=True)}
    except (TypeError, ValueError) as e:
        raise Damaged(str(e)) from None
    return v


def _json_bytes(v: Any, t: pa.DataType) -> bytes:
    return json.dumps(_to_json(v, t), separators=(",", ":")).encode()


def _join_columns(cols: list[tuple[np.ndarray, np.ndarray]], n: int, head: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise concatenation of per-column segments (after ``head`` bytes per row left for the
    caller): (the buffer, the row boundaries, n + 1 of them)."""
    total_len = np.full(n, head, np.int64)
    for lens, _ in cols:
        total_len += lens
    bounds = np.zeros(n + 1, np.int64)
    np.cumsum(total_len, out=bounds[1:])
    buf = np.empty(int(bounds[-1]), _U8)
    at = bounds[:-1] + head
    for lens, data in cols:
        first = np.cumsum(lens) - lens
        if len(data):
            buf[np.repeat(at - first, lens) + np.arange(len(data))] = data
        at = at + lens
    return buf, bounds


def present(raws: Sequence[bytes | None]) -> np.ndarray:
    """Which of ``raws`` are not None, as a boolean array (one C-level pass: no Python code
    per entry)."""
    return np.fromiter(map(is_not, raws, repeat(None)), np.bool_, count=len(raws))


def fill_missing(raws: Sequence[bytes | None], blank: bytes) -> list[bytes]:
    """``raws`` with ``blank`` in place of each None (C-level passes only)."""
    missing = raws.count(None) if isinstance(raws, list) else sum(r is None for r in raws)
    if not missing:
        return cast("list[bytes]", list(raws))
    if missing == len(raws):
        return [blank] * len(raws)
    arr = np.array(raws, dtype=object)
    arr[~present(raws)] = blank
    return cast("list[bytes]", arr.tolist())


def _split(buf: np.ndarray, bounds: np.ndarray) -> list[bytes]:
    raw = buf.tobytes()
    b = bounds.tolist()
    return [raw[b[i] : b[i + 1]] for i in range(len(b) - 1)]


def _joined(entries: list[bytes], skip: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Entries as one buffer: (the buffer, each entry's first byte after ``skip``, each end)."""
    lens = np.fromiter(map(len, entries), np.int64, count=len(entries))
    ends = np.cumsum(lens)
    buf = np.frombuffer(b"".join(entries), _U8) if entries else np.zeros(0, _U8)
    return buf, ends - lens + skip, ends


# ---------------------------------------------------------------------------- keys
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
        return rows_as_bytes(self._matrix(keys))

    def _from_bytes(self, kbs: list[bytes]) -> np.ndarray:
        joined = b"".join(kbs)
        if len(joined) != len(kbs) * self.width:
            raise Damaged(f"a key is not {self.width} bytes long")
        return np.frombuffer(joined, np.uint8).reshape(len(kbs), self.width)

    def data_keys(self, kbs: list[bytes]) -> list[bytes]:
        if not kbs:
            return []
        buf = np.empty((len(kbs), 1 + self.width), np.uint8)
        buf[:, 0] = ord("d")
        buf[:, 1:] = self._from_bytes(kbs)
        return rows_as_bytes(buf)

    def order_keys(self, kbs: list[bytes], rows: np.ndarray, orders: np.ndarray) -> list[bytes]:
        if not len(rows):
            return []
        n = len(rows)
        buf = np.empty((n, 9 + self.width), np.uint8)
        buf[:, 0] = ord("o")
        be = (orders.astype(np.int64).view(np.uint64) ^ np.uint64(_BIAS)).astype(">u8")
        buf[:, 1:9] = be.view(np.uint8).reshape(n, 8)
        buf[:, 9:] = self._from_bytes([kbs[i] for i in rows.tolist()])
        return rows_as_bytes(buf)

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


class TypedKeys:
    """Keys of any other columns (strings, floats, decimals, binaries, with or without
    integers and times) in the typed column encodings, by numpy for a whole batch."""

    name = "typed"

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.cols = [_Col(f.type, key=True) for f in schema]

    def encode(self, keys: pa.Table) -> list[bytes]:
        n = keys.num_rows
        if not self.cols:
            return [b""] * n
        buf, bounds = _join_columns([c.encode(a) for c, a in zip(self.cols, keys.columns, strict=True)], n)
        return _split(buf, bounds)

    def data_keys(self, kbs: list[bytes]) -> list[bytes]:
        return [b"d" + k for k in kbs]

    def order_keys(self, kbs: list[bytes], rows: np.ndarray, orders: np.ndarray) -> list[bytes]:
        return [b"o" + enc_order(o) + kbs[i] for i, o in zip(rows.tolist(), orders.tolist(), strict=True)]

    def decode(self, kbs: list[bytes]) -> list[pa.Array]:
        buf, pos, ends = _joined(kbs)
        out = []
        for c in self.cols:
            arr, pos = c.decode(buf, pos, ends)
            out.append(arr)
        if not np.array_equal(pos, ends):
            raise Damaged("a key is longer or shorter than its columns")
        return out


def key_encoding(schema: pa.Schema) -> str:
    """The key encoding a new state folder with keys of ``schema`` uses."""
    from headrace.state.keyindex import fixed_width_keys

    return "fixed" if fixed_width_keys(schema) else "typed"


def key_codec(schema: pa.Schema, name: str) -> FixedKeys | TypedKeys:
    """The key codec ``name`` (``fixed`` or ``typed``, checked by :func:`check_encodings`)."""
    return FixedKeys(schema) if name == "fixed" else TypedKeys(schema)


# ---------------------------------------------------------------------------- rows
class TypedRows:
    """Rows of any value types: the order (8 bytes) and its validity byte, as in
    :class:`FixedRows`, then each value in its typed column encoding."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.cols = [_Col(f.type, key=False) for f in schema]
        self.blank = bytes(9) + b"".join(c.blank for c in self.cols)  # no row: all nulls

    def encode(self, values: pa.Table, order: pa.Array) -> list[bytes]:
        n = len(order)
        ob, ov = _int64_and_valid(order)
        buf, bounds = _join_columns([c.encode(a) for c, a in zip(self.cols, values.columns, strict=True)], n, head=9)
        head = np.empty((n, 9), _U8)
        head[:, :8] = ob.view(_U8).reshape(n, 8)
        head[:, 8] = ov
        starts = bounds[:-1]
        for b in range(9):
            buf[starts + b] = head[:, b]
        return _split(buf, bounds)

    def orders(self, raws: Sequence[bytes | None]) -> tuple[np.ndarray, np.ndarray]:
        """Each row's order (0 where none) and whether it has one (False for a missing row)."""
        head = b"".join([r[:9] for r in fill_missing(raws, bytes(9))])
        if len(head) != 9 * len(raws):
            raise Damaged("a row is shorter than its order")
        m = np.frombuffer(head, _U8).reshape(len(raws), 9)
        return np.ascontiguousarray(m[:, :8]).view(np.int64).ravel(), m[:, 8].astype(np.bool_)

    def decode(self, raws: list[bytes | None]) -> tuple[np.ndarray, np.ndarray, list[pa.Array]]:
        """(orders, which have one, value arrays) of ``raws`` (``None``: a missing row, nulls)."""
        blank = self.blank
        entries = fill_missing(raws, blank)
        ords, has = self.orders(entries)
        buf, pos, ends = _joined(entries, skip=9)
        arrays = []
        for c in self.cols:
            arr, pos = c.decode(buf, pos, ends)
            arrays.append(arr)
        if not np.array_equal(pos, ends):
            raise Damaged("a row is longer or shorter than its columns")
        return ords.copy(), has, arrays


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
        return rows_as_bytes(buf)

    def _matrix(self, raws: list[bytes | None]) -> np.ndarray:
        n = len(raws)
        if not n:
            return np.zeros((0, self.width), np.uint8)
        missing = raws.count(None)
        if missing == n:
            return np.frombuffer(self.blank * n, np.uint8).reshape(n, self.width)
        data = b"".join(fill_missing(raws, self.blank) if missing else cast("list[bytes]", raws))
        if len(data) != n * self.width:
            raise Damaged(f"a row is not {self.width} bytes long")
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


def row_encoding(schema: pa.Schema) -> str:
    """The row encoding a new state folder with values of ``schema`` uses."""
    return "fixed" if all(fixed_width(f.type) for f in schema) else "typed"


def row_codec(schema: pa.Schema, name: str | None = None) -> TypedRows | FixedRows:
    """The row codec ``name`` (``fixed`` or ``typed``; by default the one for ``schema``)."""
    return FixedRows(schema) if (name or row_encoding(schema)) == "fixed" else TypedRows(schema)


def check_encodings(metadata: dict[str, Any], metadata_path: str, key_schema: pa.Schema,
                    value_schema: pa.Schema) -> tuple[str, str]:  # fmt: skip
    """The (key, row) encodings recorded in a RocksDB state folder's metadata, checked: a
    folder written with the pickle encodings of earlier versions, or naming an encoding that
    does not fit its schemas, is refused with ``CheckpointError`` (never unpickled)."""
    keys, rows = metadata.get("rocksdbKeys"), metadata.get("rocksdbRows")
    if keys in (None, "pickle") or rows is None:
        raise CheckpointError(
            f"state metadata {metadata_path} is of a RocksDB state folder written by an earlier headrace, which "
            "stored keys and rows with Python's pickle (a format that can run code when read, so it is not read); "
            "start the query over with a new checkpointLocation"
        )
    want = {"rocksdbKeys": key_encoding(key_schema), "rocksdbRows": row_encoding(value_schema)}
    for field, value in (("rocksdbKeys", keys), ("rocksdbRows", rows)):
        if value != want[field]:
            raise CheckpointError(
                f"state metadata {metadata_path} says {field}={value!r}, but keys and values of this state are "
                f"encoded as {want[field]!r}; the file was edited or comes from another state folder; restore it "
                "or start the query over with a new checkpointLocation"
            )
    return str(keys), str(rows)
