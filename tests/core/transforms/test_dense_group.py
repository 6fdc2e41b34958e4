"""dense_group gives Arrow's hash group_by result (sorted by key) where it applies, and
declines (None) where it does not."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from headrace.transforms.dense_group import dense_group

AGGS = [(None, "count_all"), ("v", "count"), ("v", "sum"), ("v", "fsum"), ("v", "sqsum"), ("f", "sum")]


def arrow_result(t: pa.Table, keys: list[str]) -> list[tuple[object, ...]]:
    sq = pa.array(np.asarray(t.column("v").to_numpy(), dtype=np.float64) ** 2)
    tt = t.append_column("vd", pa.array(np.asarray(t.column("v").to_numpy(), dtype=np.float64))).append_column("sq", sq)
    g = tt.group_by(keys).aggregate([([], "count_all"), ("v", "count"), ("v", "sum"), ("vd", "sum"), ("sq", "sum"),
                                     ("f", "sum")])  # fmt: skip
    names = [*keys, "count_all", "v_count", "v_sum", "vd_sum", "sq_sum", "f_sum"]
    return sorted(zip(*(g.column(n).to_pylist() for n in names), strict=True))


@pytest.mark.parametrize("key_type", [pa.int64(), pa.int32(), pa.int8(), pa.uint8(), pa.uint32()], ids=str)
def test_matches_arrow_group_by(key_type: pa.DataType) -> None:
    rng = np.random.default_rng(7)
    n = 5000
    lo = 0 if pa.types.is_unsigned_integer(key_type) else -50
    ws = 1_700_000_000_000_000 + rng.integers(0, 3, n) * 60_000_000 + 17
    t = pa.table({"ws": ws, "k": pa.array(rng.integers(lo, 100, n)).cast(key_type),
                  "v": rng.integers(-10**6, 10**6, n), "f": rng.random(n)})  # fmt: skip
    out = dense_group(t, ["ws", "k"], AGGS, steps={"ws": 60_000_000})
    assert out is not None
    assert out[1].type == key_type and out[2].type == pa.int64() and out[4].type == pa.int64()
    got = sorted(zip(*(c.to_pylist() for c in out), strict=True))
    want = arrow_result(t, ["ws", "k"])
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g[:5] == w[:5]  # keys, counts and integer sums exactly
        assert g[5] == w[5]  # the float sum of integers is exact
        assert g[6] == pytest.approx(w[6]) and g[7] == pytest.approx(w[7])


def test_declines_what_it_does_not_handle() -> None:
    n = 1000
    base = {"k": np.arange(n) % 10, "v": np.arange(n), "f": np.ones(n)}
    assert dense_group(pa.table(base), ["k"], AGGS) is not None
    with_null = dict(base, k=pa.array([None, *range(1, n)]))
    assert dense_group(pa.table(with_null), ["k"], AGGS) is None  # a null key
    assert dense_group(pa.table(dict(base, v=pa.array([None, *range(1, n)]))), ["k"], AGGS) is None  # a null value
    sparse = dict(base, k=np.arange(n) * 10**9, k2=np.arange(n) * 7 * 10**9)
    assert dense_group(pa.table(sparse), ["k", "k2"], AGGS) is None  # two wide keys: 1M combinations
    assert dense_group(pa.table(dict(base, v=np.full(n, 2**50))), ["k"], AGGS) is None  # float sums not exact
    assert dense_group(pa.table(dict(base, k=[str(i % 3) for i in range(n)])), ["k"], AGGS) is None  # not integers
    assert dense_group(pa.table(base), ["k"], [("v", "min")]) is None
    assert dense_group(pa.table(dict(base, k=np.arange(n) * 7 + 1)), ["k"], AGGS, steps={"k": 3}) is None  # off step
    assert dense_group(pa.table(base).slice(0, 0), ["k"], AGGS) is None


def test_a_key_with_one_value_and_keys_from_zero() -> None:
    t = pa.table({"ws": np.full(300, 120_000_000), "k": np.arange(300) % 7, "v": np.arange(300), "f": np.ones(300)})
    out = dense_group(t, ["ws", "k"], AGGS, steps={"ws": 60_000_000})
    assert out is not None
    got = sorted(zip(*(c.to_pylist() for c in out), strict=True))
    want = arrow_result(t, ["ws", "k"])
    assert [g[:6] for g in got] == [w[:6] for w in want]
    assert [g[6] for g in got] == pytest.approx([w[6] for w in want])
    one = dense_group(t, ["ws"], [(None, "count_all")], steps={"ws": 60_000_000})
    assert one is not None and [c.to_pylist() for c in one] == [[120_000_000], [300]]


def test_a_constant_key_gives_the_same_groups_as_its_column() -> None:
    """A key given as a constant (the one window a chunk lies in) instead of a column: the same
    rows out, in the same order, with the constant's type."""
    n = 2000
    t = pa.table({"k": np.arange(n) % 13, "v": np.arange(n), "f": np.ones(n)})
    with_column = dense_group(t.append_column("ws", pa.array(np.full(n, 60_000_000))), ["k", "ws"], AGGS,
                              steps={"ws": 60_000_000})  # fmt: skip
    constant = dense_group(t, ["k", "ws"], AGGS, steps={"ws": 60_000_000}, constants={"ws": (60_000_000, pa.int64())})
    assert with_column is not None and constant is not None
    assert [c.to_pylist() for c in constant] == [c.to_pylist() for c in with_column]
    assert constant[1].type == pa.int64()


@pytest.mark.parametrize("chunks", [1, 3], ids=["one-chunk", "three-chunks"])
def test_a_key_of_wide_range_is_indexed_by_its_distinct_values(chunks: int) -> None:
    """Ids drawn from a range far wider than the chunk (1,000 of 10**12): grouped by their
    distinct values (Arrow's dictionary encoding), in ascending key order, as Arrow's group_by."""
    rng = np.random.default_rng(3)
    ids = rng.choice(10**12, 1000, replace=False) - 5 * 10**11
    n = 6000
    t = pa.table({"ws": np.full(n, 60_000_000) + (np.arange(n) % 2) * 60_000_000, "k": rng.choice(ids, n),
                  "v": rng.integers(-1000, 1000, n), "f": rng.random(n)})  # fmt: skip
    t = pa.Table.from_batches([b for part in np.array_split(np.arange(n), chunks)
                               for b in t.slice(int(part[0]), len(part)).to_batches()])  # fmt: skip
    assert t.column("k").num_chunks == chunks
    out = dense_group(t, ["ws", "k"], AGGS, steps={"ws": 60_000_000})
    assert out is not None
    got = list(zip(*(c.to_pylist() for c in out), strict=True))
    want = arrow_result(t, ["ws", "k"])
    assert [g[:2] for g in got] == [w[:2] for w in want]  # ascending (ws, k), as sorted
    assert [g[2:6] for g in got] == [w[2:6] for w in want]
    assert [g[6] for g in got] == pytest.approx([w[6] for w in want])
