"""transform_with_state's opt-in batched methods (``handle_input_batch``,
``handle_expired_timer_batch``): the same rows and state as the per-key methods, batch by
batch, on both state stores; several timers of a key firing in one batch, in time order, a
deleted one not firing; TTL; misuse refused with what to do."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import headrace as hr
from headrace.errors import HeadraceError
from tests.core.transforms.test_transform_with_state import BACKENDS, T0, Driver, by_user, rows, tws

OUT = "user STRING, n BIGINT, fired BIGINT"


class PerKey(hr.StatefulProcessor):
    """Per key: a count; two event-time timers after the key's first row (1 s and 3 s later);
    the 1 s timer emits and, when the count is even, deletes the 3 s one; the 3 s one emits
    and clears the count."""

    def init(self, handle: hr.StatefulProcessorHandle) -> None:
        self.count = handle.get_value_state("count", "n BIGINT")

    def handle_input_rows(self, key: tuple[Any, ...], rows: pa.Table, tv: hr.TimerValues) -> Iterator[Any]:
        cur = self.count.get()
        if cur is None:
            first = min(int(t.timestamp() * 1000) for t in rows.column("ts").to_pylist())
            self.handle.register_timer(first + 1_000)
            self.handle.register_timer(first + 3_000)
        n = (cur or (0,))[0] + rows.num_rows
        self.count.update((n,))
        yield (key[0], n, -1)

    def handle_expired_timer(self, key: tuple[Any, ...], tv: hr.TimerValues, info: hr.ExpiredTimerInfo
                             ) -> Iterator[Any]:  # fmt: skip
        n = (self.count.get() or (0,))[0]
        timers = list(self.handle.list_timers())
        if len(timers) == 2 and n % 2 == 0:
            self.handle.delete_timer(timers[1])
        if len(timers) == 1 or n % 2 == 0:
            self.count.clear()
        yield (key[0], n, info.expiry_time_ms - T0)


class Batched(hr.StatefulProcessor):
    """:class:`PerKey` with the batched methods."""

    def init(self, handle: hr.StatefulProcessorHandle) -> None:
        self.count = handle.get_value_state("count", "n BIGINT")

    def handle_input_batch(self, batch: hr.KeyBatch, tv: hr.TimerValues) -> Iterator[Any]:
        exists = self.count.exists_batch()
        assert batch.rows is not None and batch.offsets is not None  # set for input batches
        ts = batch.rows.column("ts").cast(pa.int64()).to_numpy() // 1000
        first = np.minimum.reduceat(ts, batch.offsets[:-1])
        self.handle.register_timer_batch(first + 1_000, where=~exists)
        self.handle.register_timer_batch(first + 3_000, where=~exists)
        n = pc.add(pc.fill_null(self.count.get_batch().column("n"), 0), pa.array(batch.counts()))
        self.count.update_batch({"n": n})
        yield pa.table({"user": batch.keys.column("user"), "n": n, "fired": np.full(batch.num_keys, -1)})

    def handle_expired_timer_batch(self, batch: hr.KeyBatch, tv: hr.TimerValues, expiry: np.ndarray
                                   ) -> Iterator[Any]:  # fmt: skip
        n = pc.fill_null(self.count.get_batch().column("n"), 0).to_numpy()
        timers = self.handle.list_timers_batch()
        count = pc.list_value_length(timers).to_numpy()
        even = n % 2 == 0
        second = pc.list_element(pc.if_else(pa.array(count == 2), timers, None), 1)
        self.handle.delete_timer_batch(pc.fill_null(second, 0), where=(count == 2) & even)
        self.count.clear_batch(where=(count == 1) | even)
        yield pa.table({"user": batch.keys.column("user"), "n": n, "fired": expiry - T0})


BATCHES = [
    (rows(("a", 1, 0), ("b", 1, 0), ("b", 2, 100), ("c", 1, 500)), None),
    (rows(("a", 1, 200), ("d", 1, 900)), T0),
    (None, T0 + 1_600),  # the 1 s timers of a, b, c fire: b's count is even (2): its 3 s timer goes
    (rows(("c", 1, 5_000)), T0 + 1_600),
    (None, T0 + 10_000),  # everything left fires; d: its 1 s and 3 s timers in one batch
    (rows(("a", 1, 11_000), ("a", 2, 11_500), ("e", 1, 11_000)), T0 + 10_000),
    (None, T0 + 20_000),  # a's 1 s timer deletes its 3 s one (even count), which then does not fire
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_batched_methods_give_the_per_key_rows_and_state(tmp_path: Path, backend: str) -> None:
    def run(proc: hr.StatefulProcessor, folder: str) -> list[list[tuple[Any, ...]]]:
        d = Driver(tws(proc, OUT, "append", "event_time", watermark_column="ts"), tmp_path / folder, backend,
                   mode="append")  # fmt: skip
        out = [by_user(d.batch(i, t, wm=wm, ts=T0 + i)) for i, (t, wm) in enumerate(BATCHES)]
        left = len(d.op.store)
        d.close()
        assert left == 0
        return out

    per_key, batched = run(PerKey(), "per-key"), run(Batched(), "batched")
    assert batched == per_key
    assert per_key[2] == [("a", 2, 1_000), ("b", 2, 1_000), ("c", 1, 1_500)]
    assert per_key[4] == [("c", 2, 3_500), ("d", 1, 1_900), ("d", 1, 3_900)]  # d: two timers, in order
    assert per_key[6] == [("a", 2, 12_000), ("e", 1, 12_000), ("e", 1, 14_000)]


class Misuse(hr.StatefulProcessor):
    def __init__(self, what: str) -> None:
        self.what = what

    def init(self, handle: hr.StatefulProcessorHandle) -> None:
        self.count = handle.get_value_state("count", "n BIGINT")
        self.items = handle.get_list_state("items", "v BIGINT")

    def handle_input_batch(self, batch: hr.KeyBatch, tv: hr.TimerValues) -> Iterator[Any]:
        if self.what == "length":
            self.count.update_batch({"n": [1] * (batch.num_keys + 1)})
        elif self.what == "where":
            self.count.update_batch({"n": [1] * batch.num_keys}, where=[1] * batch.num_keys)
        elif self.what == "field":
            self.count.update_batch({"m": [1] * batch.num_keys})
        elif self.what == "list":
            self.items.append_value((1,))
        return iter(())


@pytest.mark.parametrize(("what", "match"), [
    ("length", "3 value rows for 2 keys"),
    ("where", "boolean array of one value per key"),
    ("field", "no field n"),
    ("list", "list and map state have none"),
])  # fmt: skip
def test_misuse_of_the_batched_methods_says_what_to_do(tmp_path: Path, what: str, match: str) -> None:
    d = Driver(tws(Misuse(what), time_mode="none"), tmp_path, "memory")
    with pytest.raises(HeadraceError, match=match):
        d.batch(0, rows(("a", 1, 0), ("b", 1, 0)))
    d.close()


def test_batched_state_outside_a_batched_call_is_refused(tmp_path: Path) -> None:
    class Wrong(hr.StatefulProcessor):
        def init(self, handle: hr.StatefulProcessorHandle) -> None:
            self.count = handle.get_value_state("count", "n BIGINT")

        def handle_input_rows(
            self, key: tuple[Any, ...], rows: pa.Table, tv: hr.TimerValues
        ) -> Iterator[Any]:
            self.count.get_batch()
            return iter(())

    d = Driver(tws(Wrong(), time_mode="none"), tmp_path, "memory")
    with pytest.raises(HeadraceError, match="handle_input_batch or handle_expired_timer_batch"):
        d.batch(0, rows(("a", 1, 0)))
    d.close()


def test_batched_input_in_real_time_mode_is_called_per_row(tmp_path: Path) -> None:
    class Count(hr.StatefulProcessor):
        def init(self, handle: hr.StatefulProcessorHandle) -> None:
            self.count = handle.get_value_state("count", "n BIGINT")

        def handle_input_batch(self, batch: hr.KeyBatch, tv: hr.TimerValues) -> Iterator[Any]:
            assert batch.num_keys == 1 and batch.rows is not None and batch.rows.num_rows == 1
            n = pc.add(pc.fill_null(self.count.get_batch().column("n"), 0), 1)
            self.count.update_batch({"n": n})
            yield pa.table({"user": batch.keys.column("user"), "n": n})

    d = Driver(tws(Count()), tmp_path, "memory", real_time=True)
    assert d.batch(0, rows(("a", 1, 0), ("a", 1, 0), ("b", 1, 0))) == [
        {"user": "a", "n": 1}, {"user": "a", "n": 2}, {"user": "b", "n": 1}]  # fmt: skip
    d.close()
