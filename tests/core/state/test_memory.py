"""The memory store's in-place ``add``: integer sums never wrap (an add that would overflow
int64 returns None and changes nothing, so the aggregation's checked merge reports it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from headrace.state import open_state_store

BIG = 2**62


def test_memory_add_in_place_refuses_an_overflow_without_writing(tmp_path: Path) -> None:
    """The memory store's in-place add returns None (and changes nothing) when an int64 sum
    would wrap, so the aggregation's checked merge reports it; float sums are added as before."""
    keys = pa.schema([pa.field("k", pa.int64())])
    values = pa.schema([pa.field("p0", pa.int64()), pa.field("p1", pa.float64())])
    store = open_state_store("memory", str(tmp_path), keys, values, description="test")
    store.load(-1)
    k = pa.table({"k": pa.array([1, 2], pa.int64())})
    store.put(k, pa.table({"p0": pa.array([BIG, 1], pa.int64()), "p1": [1.0, 2.0]}, schema=values))
    def vals(p0: list[int]) -> pa.Table:
        return pa.table({"p0": pa.array(p0, pa.int64()), "p1": [0.5, 0.5]}, schema=values)

    assert store.add(k, vals([BIG, 1])) is None  # key 1: 2**62 + 2**62 (every key has a row: in place)
    assert store.add(pa.table({"k": pa.array([1, 3], pa.int64())}), vals([BIG, 1])) is None  # with a new key 3
    got, found = store.get(k)
    assert found.all() and got.to_pylist() == [{"p0": BIG, "p1": 1.0}, {"p0": 1, "p1": 2.0}]
    assert store.get(pa.table({"k": pa.array([3], pa.int64())}))[1].tolist() == [False]
    added = store.add(k, vals([BIG - 1, BIG]))
    assert added is not None and added.column("p0").to_pylist() == [2**63 - 1, BIG + 1]
    assert np.isclose(added.column("p1").to_pylist(), [1.5, 2.5]).all()
    store.close()


def test_negative_sums_wrapping_sign_is_detected_in_place(tmp_path: Path) -> None:
    keys = pa.schema([pa.field("k", pa.int64())])
    values = pa.schema([pa.field("p0", pa.int64())])
    store = open_state_store("memory", str(tmp_path), keys, values, description="test")
    store.load(-1)
    k = pa.table({"k": pa.array([1], pa.int64())})
    store.put(k, pa.table({"p0": pa.array([-(2**63) + 1], pa.int64())}))
    assert store.add(k, pa.table({"p0": pa.array([-2], pa.int64())})) is None
    added = store.add(k, pa.table({"p0": pa.array([-1], pa.int64())}))
    assert added is not None and added.column("p0").to_pylist() == [-(2**63)]
    store.close()

