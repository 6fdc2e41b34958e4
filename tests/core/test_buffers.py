"""headrace._buffers: pooled int64 columns are never handed out twice while in use."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa

from headrace import _buffers
from headrace._buffers import POOL_ROWS, SMALL_ROWS, int64_array, new_int64


def column(n: int, value: int) -> pa.Array:
    buf, view = new_int64(n)
    view[:] = value
    return int64_array(buf, n)


def test_memory_in_use_is_not_reused_and_free_memory_is() -> None:
    a = column(50_000, 1)
    b = column(50_000, 2)
    assert a.buffers()[1].address != b.buffers()[1].address
    kept = a.slice(10, 5)  # a slice keeps the whole buffer in use
    view = b.to_numpy()  # so does a numpy view of the array
    address_a = a.buffers()[1].address
    del a, b
    c = column(50_000, 3)
    assert c.buffers()[1].address != address_a
    assert kept.to_pylist() == [1] * 5 and view[:3].tolist() == [2, 2, 2]
    del kept, c
    d = column(50_000, 4)
    assert d.buffers()[1].address == address_a  # free again: reused
    assert view[:3].tolist() == [2, 2, 2]


def test_sizes_outside_the_pool_get_their_own_memory() -> None:
    small = column(SMALL_ROWS - 1, 5)
    big = column(POOL_ROWS + 1, 6)
    assert small.to_numpy()[[0, -1]].tolist() == [5, 5] and big.to_numpy()[[0, -1]].tolist() == [6, 6]


def test_threads_never_share_an_array() -> None:
    kept: list[pa.Array] = []
    lock = threading.Lock()
    errors: list[str] = []

    def work(k: int) -> None:
        for i in range(50):
            arr = column(20_000, k * 1000 + i)
            with lock:
                kept.append(arr)
            if arr.to_numpy()[[0, -1]].tolist() != [k * 1000 + i] * 2:
                errors.append(f"thread {k} column {i} overwritten")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    firsts = sorted(int(a.to_numpy()[0]) for a in kept)
    assert firsts == sorted(k * 1000 + i for k in range(4) for i in range(50))
    in_pool = {a.buffers()[1].address for a in kept} & {int(p.ctypes.data) for p in _buffers._POOL}
    assert len(in_pool) <= _buffers.POOL_MAX
    assert all(np.unique([a.buffers()[1].address for a in kept], return_counts=True)[1] == 1)
