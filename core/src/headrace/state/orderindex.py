"""The memory backend's event-time index: which slots hold an order value (the event time a
row is evicted by) up to a watermark.

Entries ``(order, slot)`` are kept in a few *runs*, numpy arrays sorted by order: each call of
:meth:`OrderIndex.add` sorts its batch's entries into one new run (one ``argsort``), and runs
of similar length are merged, as in a log-structured merge tree, so there are O(log n) runs and
each entry is merged O(log n) times. :meth:`OrderIndex.pop_upto` takes from every run the
prefix up to the watermark (a ``searchsorted`` and a slice), so eviction costs the entries
evicted, whatever the state's size; no Python object per entry exists anywhere.

Entries are not removed when a row's order changes or the row is removed: the caller keeps the
authoritative order per slot, and :meth:`pop_upto` keeps only the entries that still agree with
it (a slot freed and reused with the same order yields one entry per placement: the caller's
check keeps one). Such stale entries are counted, and once they outnumber the live ones the index
is rebuilt from the live ones, so its size stays within twice the live rows plus a constant and
the rebuild amortises to the changes that made the entries stale.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["OrderIndex"]

#: a rebuild is considered once the stale entries reach this many (and outnumber the live ones)
_MIN_STALE = 4096


class OrderIndex:
    """Sorted runs of ``(order, slot)``; see the module docstring. ``current(orders, slots)``
    is the caller's check of which entries still hold (a boolean array, true for one entry per
    slot at most), ``live()`` returns every live ``(orders, slots)`` (for a rebuild)."""

    def __init__(
        self,
        current: Callable[[np.ndarray, np.ndarray], np.ndarray],
        live: Callable[[], tuple[np.ndarray, np.ndarray]],
    ) -> None:
        self._current = current
        self._live = live
        self._runs: list[tuple[np.ndarray, np.ndarray]] = []  # (orders ascending, slots)
        self._entries = 0
        self._stale = 0

    def add(self, orders: np.ndarray, slots: np.ndarray) -> None:
        """Index ``slots`` under ``orders`` (int64 arrays of one length). Called by each put
        whose rows gained or changed their order."""
        if not len(slots):
            return
        if len(orders) > 1 and bool((orders[1:] < orders[:-1]).any()):
            by = np.argsort(orders, kind="stable")
            orders, slots = orders[by], slots[by]
        else:
            orders, slots = orders.copy(), slots.copy()
        self._runs.append((orders, slots))
        self._entries += len(orders)
        runs = self._runs
        while len(runs) > 1 and len(runs[-2][0]) <= 2 * len(runs[-1][0]):
            b = runs.pop()
            a = runs.pop()
            runs.append(_merge(a, b))

    def stale(self, n: int) -> None:
        """``n`` entries stopped holding (their rows were removed or changed order). Called by
        the caller's remove/re-order; rebuilds the index once stale entries dominate."""
        self._stale += n
        if self._stale >= _MIN_STALE and 2 * self._stale > self._entries:
            self.rebuild()

    def rebuild(self) -> None:
        """One run of the live entries (read from the caller)."""
        orders, slots = self._live()
        self._runs = []
        self._entries = self._stale = 0
        self.add(orders.astype(np.int64, copy=False), slots.astype(np.int64, copy=False))

    def earliest(self) -> int | None:
        """The smallest order indexed (possibly of a stale entry: an early estimate)."""
        firsts = [int(o[0]) for o, _ in self._runs if len(o)]
        return min(firsts) if firsts else None

    def pop_upto(self, upto: int) -> np.ndarray:
        """The slots whose current order is ``<= upto`` (each once, in order of their order
        values), taken out of the index. Costs the entries up to ``upto``."""
        taken_o: list[np.ndarray] = []
        taken_s: list[np.ndarray] = []
        kept: list[tuple[np.ndarray, np.ndarray]] = []
        for orders, slots in self._runs:
            cut = int(np.searchsorted(orders, upto, side="right"))
            if cut:
                taken_o.append(orders[:cut])
                taken_s.append(slots[:cut])
            if cut < len(orders):
                kept.append((orders[cut:], slots[cut:]) if cut else (orders, slots))
        self._runs = kept
        if not taken_s:
            return np.empty(0, np.int64)
        if len(taken_s) > 1:
            o, s = np.concatenate(taken_o), np.concatenate(taken_s)
            by = np.argsort(o, kind="stable")
            o, s = o[by], s[by]
        else:
            o, s = taken_o[0], taken_s[0]
        ok = self._current(o, s)
        out = s[ok]
        self._entries -= len(s)
        self._stale = max(0, self._stale - (len(s) - len(out)))
        return out

    def clear(self) -> None:
        self._runs = []
        self._entries = self._stale = 0

    def nbytes(self) -> int:
        return int(sum(o.nbytes + s.nbytes for o, s in self._runs))


def _merge(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Two sorted runs as one (``a``'s entries first among equal orders)."""
    orders = np.concatenate([a[0], b[0]])
    slots = np.concatenate([a[1], b[1]])
    if len(a[0]) and len(b[0]) and a[0][-1] <= b[0][0]:
        return orders, slots  # already in order (event time mostly advances)
    by = np.argsort(orders, kind="stable")
    return orders[by], slots[by]
