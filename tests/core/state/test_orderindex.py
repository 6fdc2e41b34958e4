"""The memory backend's event-time index (sorted runs, stale entries dropped lazily)."""

from __future__ import annotations

import numpy as np
import pytest

from headrace.state.orderindex import OrderIndex


class Owner:
    """The authoritative order per slot, as the memory store keeps it."""

    def __init__(self, capacity: int = 64) -> None:
        self.order = np.zeros(capacity, np.int64)
        self.has = np.zeros(capacity, np.bool_)
        self.mark = np.zeros(capacity, np.int64)
        self.index = OrderIndex(self.current, self.live)

    def current(self, orders: np.ndarray, slots: np.ndarray) -> np.ndarray:
        ok = self.has[slots] & (self.order[slots] == orders)
        idx = np.flatnonzero(ok)
        self.mark[slots[idx]] = idx
        ok[idx] = self.mark[slots[idx]] == idx
        return ok

    def live(self) -> tuple[np.ndarray, np.ndarray]:
        slots = np.flatnonzero(self.has)
        return self.order[slots], slots

    def set(self, slots: list[int], orders: list[int]) -> None:
        s, o = np.array(slots, np.int64), np.array(orders, np.int64)
        stale = int(self.has[s].sum())
        self.order[s], self.has[s] = o, True
        self.index.add(o, s)
        self.index.stale(stale)

    def drop(self, slots: list[int]) -> None:
        s = np.array(slots, np.int64)
        stale = int(self.has[s].sum())
        self.has[s] = False
        self.index.stale(stale)

    def evict(self, upto: int) -> list[int]:
        out = self.index.pop_upto(upto)
        self.has[out] = False
        return out.tolist()


def test_evicts_in_order_of_event_time_across_runs() -> None:
    o = Owner()
    o.set([0, 1, 2], [30, 10, 20])
    o.set([3, 4], [15, 5])
    assert o.index.earliest() == 5
    assert o.evict(15) == [4, 1, 3]
    assert o.evict(15) == []
    assert o.evict(100) == [2, 0]
    assert o.index.earliest() is None


def test_changed_and_removed_rows_are_not_evicted_by_their_old_order() -> None:
    o = Owner()
    o.set([0, 1, 2], [10, 10, 10])
    o.set([0], [50])  # re-ordered
    o.drop([1])  # removed
    assert o.evict(20) == [2]
    assert o.evict(60) == [0]


@pytest.mark.parametrize("reorders", [1, 3], ids=["reused-once", "reused-thrice"])
def test_a_slot_reused_with_the_same_order_is_evicted_once(reorders: int) -> None:
    o = Owner()
    for _ in range(reorders):
        o.set([7], [10])
        o.drop([7])
    o.set([7], [10])
    assert o.evict(10) == [7]


def test_stale_entries_trigger_a_rebuild_that_keeps_the_live_ones() -> None:
    o = Owner(capacity=20_000)
    slots = list(range(10_000))
    o.set(slots, [100] * len(slots))
    o.drop(slots[:9_000])  # stale entries outnumber the live ones: rebuilt
    assert o.index._entries == 1_000
    assert o.evict(100) == slots[9_000:]


def test_runs_stay_few_as_batches_arrive() -> None:
    o = Owner(capacity=1 << 16)
    for b in range(1000):
        o.set([b], [1000 - b])  # event time going backwards: every run needs a merge
    assert len(o.index._runs) <= 11
    assert o.evict(500) == list(range(999, 499, -1))
