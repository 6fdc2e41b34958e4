"""Grouping by direct indexing, for the common shape of streaming aggregations: integer keys
(a window's start, a bucket such as ``value % 10000``) whose values span a range not much
larger than the chunk, and counts and sums without nulls.

Each key is mapped to ``(value - min) // step`` (``step``: the window's slide for a window
start), the keys' indexes are combined into one group id, and ``numpy.bincount`` counts and
sums per group in one pass each: ~3x cheaper than a hash ``group_by`` of two key columns.
Integer sums go through float64 ``bincount`` only when every partial sum is exact
(``rows * max |value| < 2**53``). Anything else (nulls, other types, min/max, a key range
too sparse for the chunk) returns ``None`` and the caller uses Arrow's hash ``group_by``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa

__all__ = ["dense_group"]

_EXACT = 2**53
_SMALL_INTS = (pa.uint8(), pa.uint16(), pa.uint32())


def _ints(col: pa.ChunkedArray | pa.Array) -> np.ndarray | None:
    t = col.type
    if col.null_count or not (pa.types.is_signed_integer(t) or t in _SMALL_INTS):
        return None
    return np.asarray(col.to_numpy(), dtype=np.int64)


def _as(values: np.ndarray, t: pa.DataType) -> pa.Array:
    """int64 ``values`` as an Arrow array of the key's type ``t`` (no cast when it is int64)."""
    arr = pa.array(values)
    return arr if t == pa.int64() else arr.cast(t)


def dense_group(
    table: pa.Table,
    keys: Sequence[str],
    aggs: Sequence[tuple[str | None, str]],
    *,
    steps: Mapping[str, int] | None = None,
    constants: Mapping[str, tuple[int, pa.DataType]] | None = None,
) -> list[pa.Array] | None:
    """``table`` grouped by ``keys``: the key columns (with their input types), then one
    column per ``(column, function)`` of ``aggs``, a row per group in ascending key order.
    Functions: ``count_all`` (column ``None``) and ``count`` (int64), ``sum`` (int64 for
    integers, float64 for floats), ``fsum`` (the sum as float64: DuckDB's
    ``sum(CAST(x AS DOUBLE))``, exact here as every partial sum is), ``sqsum`` (the sum of
    squares as float64). A column's sums are computed once whatever asks for them. ``None``
    when the chunk is not of the shape this handles. ``steps``: keys whose values are
    multiples of a step plus a common offset (window starts). ``constants``: keys that are not
    columns of ``table`` but one value (and type) for every row, e.g. the start of the one
    window a chunk lies in: no column of that value is built nor indexed."""
    n = table.num_rows
    if not n:
        return None
    limit = max(4 * n, 1 << 16)
    steps = steps or {}
    values: dict[str, np.ndarray] = {}
    for col, fn in aggs:  # check everything before computing anything
        if fn == "count_all":
            continue
        assert col is not None
        c = table.column(col)
        if c.null_count or fn not in ("count", "sum", "fsum", "sqsum"):
            return None
        if fn == "count" or col in values:
            continue
        t = c.type
        if pa.types.is_floating(t):
            values[col] = np.asarray(c.to_numpy(), dtype=np.float64)
            continue
        x = _ints(c)
        if x is None:
            return None
        if n * max(abs(int(x.min())), abs(int(x.max()))) >= _EXACT:
            return None
        values[col] = x
    gid: np.ndarray | None = None
    groups = 1
    layout: list[tuple[pa.DataType, int, int, int]] = []
    constants = constants or {}
    for k in keys:
        if k in constants:
            value, typ = constants[k]
            layout.append((typ, value, 1, 1))
            continue
        c = table.column(k)
        a = _ints(c)
        if a is None:
            return None
        lo, hi = int(a.min()), int(a.max())
        step = int(steps.get(k, 1))
        if lo == hi:  # one value (a chunk within one window): no index to compute
            layout.append((c.type, lo, 1, 1))
            continue
        idx = a - lo if lo else a
        if step > 1:
            off = idx
            idx = off // step
            if not np.array_equal(idx * step, off):  # (numpy's int64 % costs 6x a division)
                return None
        r = (hi - lo) // step + 1
        groups *= r
        if groups > limit:
            return None
        gid = idx if gid is None else gid * r + idx
        layout.append((c.type, lo, step, r))
    if gid is None:
        gid = np.zeros(n, np.int64)
    counts = np.bincount(gid, minlength=groups)
    present = np.flatnonzero(counts)
    out_keys: list[pa.Array] = []
    rest = present
    varying = sum(1 for *_, r in layout if r > 1)
    for t, lo, step, r in reversed(layout):
        if r == 1:  # one value: no arithmetic over the groups
            out_keys.append(_as(np.full(len(present), lo, np.int64), t))
            continue
        varying -= 1
        idx = rest % r if varying else rest  # the outermost varying key: rest < r already
        if step != 1:
            idx = idx * step
        out_keys.append(_as(idx + lo if lo else idx, t))
        if varying:
            rest = rest // r
    out: list[pa.Array] = out_keys[::-1]
    n_present = counts[present]
    done: dict[tuple[str, bool], np.ndarray] = {}
    for col, fn in aggs:
        if fn in ("count_all", "count"):
            out.append(pa.array(n_present))
            continue
        assert col is not None
        x = values[col]
        square = fn == "sqsum"
        s = done.get((col, square))
        if s is None:
            w = x.astype(np.float64) * x if square else x
            s = done[(col, square)] = np.bincount(gid, weights=w, minlength=groups)[present]
        out.append(pa.array(np.rint(s).astype(np.int64) if fn == "sum" and x.dtype == np.int64 else s))
    return out
