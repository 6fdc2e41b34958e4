"""Vectorised encoding of an Arrow table into PostgreSQL's binary COPY format.

Columns whose target type is one of :data:`FAST_OIDS` (booleans, integers, floats, text-like,
bytea, date, timestamp, timestamptz) are encoded with Arrow compute kernels and numpy, without a
Python object per value: each column becomes a binary array of ``int32 length + payload``
segments (``-1`` for NULL), and the segments of a row are joined after the 2-byte field count.
Tables with any other column type go through psycopg's per-row ``write_row`` instead (see
``headrace_lakebase.writer``).
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["FAST_OIDS", "SIGNATURE", "TRAILER", "encode_pieces", "encode_rows"]

SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)
TRAILER = struct.pack("!h", -1)
_NULL_BYTES = struct.pack("!i", -1)
_PG_EPOCH_DAYS = 10957  # 2000-01-01 - 1970-01-01
_PG_EPOCH_US = _PG_EPOCH_DAYS * 86_400_000_000

# oid -> (numpy big-endian dtype, Arrow type to cast to first)
_FIXED: dict[int, tuple[str, pa.DataType]] = {
    16: (">u1", pa.uint8()),
    21: (">i2", pa.int16()),
    23: (">i4", pa.int32()),
    20: (">i8", pa.int64()),
    700: (">f4", pa.float32()),
    701: (">f8", pa.float64()),
    1082: (">i4", pa.int32()),
    1114: (">i8", pa.int64()),
    1184: (">i8", pa.int64()),
}
_TEXT = {25, 1043, 1042, 19}
_BYTEA = {17}
FAST_OIDS = frozenset(_FIXED) | _TEXT | _BYTEA
"""Target type oids the vectorised encoder handles."""


def _fixed_segments(arr: pa.Array, oid: int) -> pa.Array:
    np_type, arrow_type = _FIXED[oid]
    t = arr.type
    if oid == 16:
        values = pc.cast(arr, pa.uint8())
    elif oid == 1082:
        if pa.types.is_timestamp(t):
            arr = pc.cast(arr, pa.date32())
        values = pc.subtract(pc.cast(pc.cast(arr, pa.date32()), pa.int32()), pa.scalar(_PG_EPOCH_DAYS, pa.int32()))
    elif oid in (1114, 1184):
        if pa.types.is_date(t):
            arr = pc.cast(arr, pa.timestamp("us"))
        elif t.unit != "us":
            arr = pc.cast(arr, pa.timestamp("us", tz=t.tz), safe=False)
        values = pc.subtract(pc.cast(arr, pa.int64()), pa.scalar(_PG_EPOCH_US, pa.int64()))
    else:
        values = pc.cast(arr, arrow_type)  # safe cast: overflow raises (e.g. int64 into integer)
    width = np.dtype(np_type).itemsize
    nums = values.fill_null(0).to_numpy(zero_copy_only=False).astype(np_type, copy=False)
    rec = np.empty(len(nums), dtype=[("n", ">i4"), ("v", np_type)])
    rec["n"] = width
    rec["v"] = nums
    buf = pa.py_buffer(rec.tobytes())
    segs = pa.FixedSizeBinaryArray.from_buffers(pa.binary(4 + width), len(nums), [None, buf]).cast(pa.binary())
    if arr.null_count:
        segs = pc.if_else(arr.is_valid(), segs, pa.scalar(_NULL_BYTES, pa.binary()))
    return segs


def _var_segments(arr: pa.Array) -> pa.Array:
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode()
        t = arr.type
    if pa.types.is_fixed_size_binary(t):
        arr = arr.cast(pa.binary())
    elif not pa.types.is_binary(t):
        arr = pc.cast(arr, pa.large_binary() if pa.types.is_large_string(t) or pa.types.is_large_binary(t) else pa.binary())
    data = arr.fill_null(b"")
    lengths = pc.binary_length(data).to_numpy(zero_copy_only=False).astype(">i4")
    lens = pa.FixedSizeBinaryArray.from_buffers(pa.binary(4), len(lengths), [None, pa.py_buffer(lengths.tobytes())])
    segs = pc.binary_join_element_wise(lens.cast(data.type), data, pa.scalar(b"", data.type))
    if arr.null_count:
        segs = pc.if_else(arr.is_valid(), segs, pa.scalar(_NULL_BYTES, segs.type))
    return segs


def encode_rows(table: pa.Table, oids: list[int]) -> bytes:
    """The rows of ``table`` (columns in the order of ``oids``, the target types) in binary
    COPY format, without signature and trailer, as one ``bytes``. Every oid must be in
    :data:`FAST_OIDS`. The sink uses :func:`encode_pieces` (no copy); this is for callers that
    want the bytes.
    """
    return bytes(_encode(table, oids))


def encode_pieces(table: pa.Table, oids: list[int]) -> tuple[memoryview, ...]:
    """The whole binary COPY stream of ``table``: signature, rows, trailer, as pieces to pass
    to psycopg's ``Copy.write`` one by one. The rows piece is a view of Arrow's buffer: nothing
    is copied in Python (``SIGNATURE + rows + TRAILER`` used to copy a ~23 MB chunk twice).

    Called once per flushed chunk. Raises ``pyarrow.ArrowInvalid`` when a value does not fit
    its target type (e.g. an int64 too large for an integer column).
    """
    return memoryview(SIGNATURE), _encode(table, oids), memoryview(TRAILER)


def _encode(table: pa.Table, oids: list[int]) -> memoryview:
    n = table.num_rows
    if n == 0:
        return memoryview(b"")
    segments: list[pa.Array] = []
    large = False
    for col, oid in zip(table.columns, oids, strict=True):
        arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        if oid in _FIXED:
            seg = _fixed_segments(arr, oid)
        elif oid in _TEXT or oid in _BYTEA:
            seg = _var_segments(arr)
        else:
            raise ValueError(f"type oid {oid} is not handled by the fast encoder")
        large = large or pa.types.is_large_binary(seg.type)
        segments.append(seg)
    btype = pa.large_binary() if large else pa.binary()
    header = pa.scalar(struct.pack("!h", len(oids)), btype)
    segments = [s.cast(btype) if s.type != btype else s for s in segments]
    rows = pc.binary_join_element_wise(header, *segments, pa.scalar(b"", btype))
    if isinstance(rows, pa.ChunkedArray):
        rows = rows.combine_chunks()
    offsets_type = np.int64 if large else np.int32
    offsets = np.frombuffer(rows.buffers()[1], dtype=offsets_type, count=len(rows) + 1 + rows.offset)
    start, end = int(offsets[rows.offset]), int(offsets[rows.offset + len(rows)])
    return memoryview(rows.buffers()[2].slice(start, end - start))
