"""transform_with_state: every state type and method, TTL, both timer kinds, initial state,
restarts and replays, refused changes of the declared state, output modes, real-time mode,
the cost of a batch; on both state stores. The operator is driven as the engine drives it
(open, begin, process per chunk, finish, the state write, close), then through the engine."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pytest

import headrace as hr
from headrace.errors import CheckpointError, HeadraceError, UnsupportedError
from headrace.state import StateStore
from headrace.testing import memory_stream
from headrace.transforms.operator import BatchInfo, OperatorContext
from headrace.transforms.transform_with_state import TransformWithStateOperator

BACKENDS = ["memory", "rocksdb"]
IN = pa.schema([("user", pa.string()), ("v", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))])
T0 = 1_700_000_000_000


def rows(*items: tuple[str, int, int]) -> pa.Table:
    """(user, v, event time ms) rows."""
    return pa.table({"user": [u for u, _, _ in items], "v": [v for _, v, _ in items],
                     "ts": pa.array([(T0 + t) * 1000 for _, _, t in items], pa.timestamp("us", tz="UTC"))},
                    schema=IN)  # fmt: skip


class Driver:
    """One query run of a TransformWithStateOperator, batch by batch."""

    def __init__(self, op: TransformWithStateOperator, path: Path, backend: str, *, mode: str = "update",
                 real_time: bool = False, last: int = -1) -> None:  # fmt: skip
        self.op = op
        op.output_schema(IN)
        op.open(OperatorContext(index=0, state_path=str(path), state_backend=backend, output_mode=mode,
                                real_time=real_time, options={"lastCommittedBatch": last}))  # fmt: skip
        self.real_time = real_time

    def batch(self, n: int, table: pa.Table | None, *, ts: int = T0, wm: int | None = None,
              chunks: int = 1) -> list[dict[str, Any]]:  # fmt: skip
        info = BatchInfo(n, watermark_ms=wm, real_time=self.real_time, timestamp_ms=ts)
        self.op.begin(info)
        out = []
        if table is not None and table.num_rows:
            step = -(-table.num_rows // chunks)
            for lo in range(0, table.num_rows, step):
                o = self.op.process(table.slice(lo, step), info)
                if o is not None:
                    out.extend(o.to_pylist())
        o = self.op.finish(info)
        if o is not None:
            out.extend(o.to_pylist())
        w = self.op.state_write()
        if w is not None:
            w.result()
        return out

    def close(self) -> None:
        self.op.close()


def tws(proc: hr.StatefulProcessor, out: str = "user STRING, n BIGINT", mode: str = "update",
        time_mode: str = "processing_time", **kw: Any) -> TransformWithStateOperator:  # fmt: skip
    return TransformWithStateOperator(["user"], proc, out, mode, time_mode, **kw)


class Counting(hr.StatefulProcessor):
    """A running count per key in value state (optional TTL)."""

    def __init__(self, ttl: Any = None) -> None:
        self.ttl = ttl

    def init(self, handle: hr.StatefulProcessorHandle) -> None:
        self.count = handle.get_value_state("count", "n BIGINT", ttl=self.ttl)

    def handle_input_rows(self, key: tuple[Any, ...], rows: pa.Table, tv: hr.TimerValues) -> Iterator[Any]:
        n = (self.count.get() or (0,))[0] + rows.num_rows
        self.count.update((n,))
        yield {"user": key[0], "n": n}


def by_user(out: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(tuple(r.values()) for r in out)


@pytest.mark.parametrize("backend", BACKENDS)
def test_value_state_counts_across_batches_and_restarts(tmp_path: Path, backend: str) -> None:
    d = Driver(tws(Counting()), tmp_path, backend)
    assert by_user(d.batch(0, rows(("a", 1, 0), ("b", 2, 0), ("a", 3, 0)))) == [("a", 2), ("b", 1)]
    assert by_user(d.batch(1, rows(("a", 4, 0)), chunks=1)) == [("a", 3)]
    d.close()
    d = Driver(tws(Counting()), tmp_path, backend, last=1)  # a new run restores version 1
    assert by_user(d.batch(2, rows(("a", 5, 0), ("b", 1, 0)), chunks=2)) == [("a", 4), ("b", 2)]
    # a replay of batch 2 starts again from version 1: the same output
    assert by_user(d.batch(2, rows(("a", 5, 0), ("b", 1, 0)))) == [("a", 4), ("b", 2)]
    d.close()


class AllTypes(hr.StatefulProcessor):
    """Every method of list and map state, and value exists/clear; emits what it sees."""

    def init(self, handle: hr.StatefulProcessorHandle) -> None:
        self.last = handle.get_value_state("last", "v BIGINT, at TIMESTAMP")
        self.seen = handle.get_list_state("seen", "v BIGINT")
        self.per = handle.get_map_state("per", "parity STRING", "total BIGINT")

    def handle_input_rows(self, key: tuple[Any, ...], rows: pa.Table, tv: hr.TimerValues) -> Iterator[Any]:
        vs = rows.column("v").to_pylist()
        had = self.last.exists()
        if -1 in vs:  # a reset
            self.last.clear()
            self.seen.clear()
            self.per.clear()
            yield (key[0], "reset", str(self.last.exists() or self.seen.exists() or self.per.exists()))
            return
        if 0 in vs:
            self.seen.put([(v,) for v in vs if v])
            self.per.remove_key(("even",))
        else:
            self.seen.append_list([(v,) for v in vs[1:]])
            self.seen.append_value((vs[0],))
        for v in vs:
            p = "even" if v % 2 == 0 else "odd"
            if v:
                self.per.update_value((p,), ((self.per.get_value((p,)) or (0,))[0] + v,))
        self.last.update((vs[-1], rows.column("ts")[-1].as_py()))
        seen = sorted(v for (v,) in self.seen.get())
        per = sorted((k[0], v[0]) for k, v in self.per.iterator())
        assert sorted(k for (k,) in self.per.keys())  # noqa: SIM118 == [k for k, _ in per]
        assert sorted(v for (v,) in self.per.values()) == sorted(v for _, v in per)
        yield (key[0], f"had={had} contains_even={self.per.contains_key(('even',))}", f"{seen} {per}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_list_and_map_state_methods(tmp_path: Path, backend: str) -> None:
    make = lambda: tws(AllTypes(), "user STRING, what STRING, state STRING", time_mode="none")  # noqa: E731
    d = Driver(make(), tmp_path, backend)
    assert d.batch(0, rows(("a", 1, 0), ("a", 2, 0))) == [
        {"user": "a", "what": "had=False contains_even=True", "state": "[1, 2] [('even', 2), ('odd', 1)]"}
    ]
    d.close()
    d = Driver(make(), tmp_path, backend, last=0)
    assert d.batch(1, rows(("a", 3, 1))) == [
        {"user": "a", "what": "had=True contains_even=True", "state": "[1, 2, 3] [('even', 2), ('odd', 4)]"}
    ]
    # put replaces the list; remove_key drops one map entry
    assert d.batch(2, rows(("a", 0, 2), ("a", 5, 2))) == [
        {"user": "a", "what": "had=True contains_even=False", "state": "[5] [('odd', 9)]"}
    ]
    assert d.batch(3, rows(("a", -1, 3))) == [{"user": "a", "what": "reset", "state": "False"}]
    assert (len(cast(StateStore, d.op.handle_._variables["seen"].store)) == 0
            and len(cast(StateStore, d.op.handle_._variables["last"].store)) == 0)  # fmt: skip
    d.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_value_state_ttl_expires_by_processing_time(tmp_path: Path, backend: str) -> None:
    d = Driver(tws(Counting(ttl="10 seconds")), tmp_path, backend)
    assert by_user(d.batch(0, rows(("a", 1, 0), ("b", 1, 0)), ts=T0)) == [("a", 1), ("b", 1)]
    assert by_user(d.batch(1, rows(("a", 1, 0)), ts=T0 + 5_000)) == [("a", 2)]  # a's TTL reset: T0 + 15 s
    store = d.op.handle_._variables["count"].store
    assert store is not None  # opened by the first batch
    assert len(store) == 2
    # at T0 + 10 s b's value expired (removed at the end of the batch); a's is alive
    assert d.batch(2, None, ts=T0 + 10_000) == [] and len(store) == 1
    assert by_user(d.batch(3, rows(("a", 1, 0), ("b", 1, 0)), ts=T0 + 12_000)) == [("a", 3), ("b", 1)]
    # an expired value is not returned even before its row is removed
    assert by_user(d.batch(4, rows(("a", 1, 0)), ts=T0 + 40_000)) == [("a", 1)]
    assert d.op.needs_batch_at_time(T0 + 40_000 + 9_999) is False
    assert d.op.needs_batch_at_time(T0 + 50_000) is True  # a's new TTL is due: a no-data batch is wanted
    d.close()


class ListTtl(hr.StatefulProcessor):
    def init(self, handle: hr.StatefulProcessorHandle) -> None:
        self.items = handle.get_list_state("items", "v BIGINT", ttl=10_000)
        self.m = handle.get_map_state("m", "k BIGINT", "v BIGINT", ttl="10 seconds")

    def handle_input_rows(self, key: tuple[Any, ...], rows: pa.Table, tv: hr.TimerValues) -> Iterator[Any]:
        for v in rows.column("v").to_pylist():
            if v >= 0:
                self.items.append_value((v,))
                self.m.update_value((v,), (v * 10,))
        yield (key[0], str([v for (v,) in self.items.get()]) + " " + str(sorted(k for (k,) in self.m.keys())))  # noqa: SIM118


@pytest.mark.parametrize("backend", BACKENDS)
def test_list_and_map_ttl_per_element(tmp_path: Path, backend: str) -> None:
    d = Driver(tws(ListTtl(), "user STRING, s STRING"), tmp_path, backend)
    assert d.batch(0, rows(("a", 1, 0)), ts=T0) == [{"user": "a", "s": "[1] [1]"}]
    assert d.batch(1, rows(("a", 2, 0)), ts=T0 + 6_000) == [{"user": "a", "s": "[1, 2] [1, 2]"}]
    # element 1 expired at T0 + 10 s (removed from the stored row then), element 2 lives on
    assert d.batch(2, None, ts=T0 + 11_000) == []
    row = cast(StateStore, d.op.handle_._variables["items"].store).scan().column("__items").to_pylist()
    assert [i["value"]["v"] for i in row[0]] == [2]
    assert d.batch(3, rows(("a", -1, 0)), ts=T0 + 12_000) == [{"user": "a", "s": "[2] [2]"}]
    assert d.batch(4, rows(("a", -1, 0)), ts=T0 + 17_000) == [{"user": "a", "s": "[] []"}]
    d.close()


class Sessions(hr.StatefulProcessor):
    """Sessionisation: a session per user ends 30 s (event time) after its last row."""

    def init(self, handle: hr.StatefulProcessorHandle) -> None:
        self.start = handle.get_value_state("start", "start BIGINT, last BIGINT, n BIGINT")

    def handle_input_rows(self, key: tuple[Any, ...], rows: pa.Table, tv: hr.TimerValues) -> Iterator[Any]:
        ts = [int(t.timestamp() * 1000) for t in rows.column("ts").to_pylist()]
        cur = self.start.get()
        start, last, n = cur if cur else (min(ts), min(ts), 0)
        if cur:
            self.handle.delete_timer(last + 30_000)
        last = max(last, *ts)
        self.start.update((start, last, n + len(ts)))
        self.handle.register_timer(last + 30_000)
        assert list(self.handle.list_timers()) == [last + 30_000]
        return iter(())

    def handle_expired_timer(self, key: tuple[Any, ...], tv: hr.TimerValues, info: hr.ExpiredTimerInfo
                             ) -> Iterator[Any]:  # fmt: skip
        start, last, n = self.start.get()  # type: ignore[misc]
        assert info.expiry_time_ms == last + 30_000 and tv.current_watermark_ms > info.expiry_time_ms
        self.start.clear()
        yield (key[0], start - T0, last - T0, n)


@pytest.mark.parametrize("backend", BACKENDS)
def test_event_time_timers_fire_when_the_watermark_passes_them(tmp_path: Path, backend: str) -> None:
    def make() -> TransformWithStateOperator:
        out = "user STRING, start BIGINT, last BIGINT, n BIGINT"
        return tws(Sessions(), out, "append", "event_time", watermark_column="ts")

    d = Driver(make(), tmp_path, backend, mode="append")
    assert d.batch(0, rows(("a", 1, 0), ("b", 1, 5_000)), wm=None) == []
    assert d.batch(1, rows(("a", 1, 10_000)), wm=T0 + 5_000) == []
    assert d.op.needs_batch_at(T0 + 35_001) is True  # b's timer at T0 + 35 s is earlier than this watermark
    # no timer (a's earliest ever was T0 + 30 s) is earlier than T0 + 30 s: no batch wanted
    assert d.op.needs_batch_at(T0 + 30_000) is False
    d.close()
    d = Driver(make(), tmp_path, backend, mode="append", last=1)
    assert d.batch(2, None, wm=T0 + 35_001) == [{"user": "b", "start": 5_000, "last": 5_000, "n": 1}]
    assert d.batch(3, rows(("b", 1, 36_000)), wm=T0 + 35_001) == []
    assert sorted(map(tuple, (r.values() for r in d.batch(4, None, wm=T0 + 100_000)))) == [
        ("a", 0, 10_000, 2),
        ("b", 36_000, 36_000, 1),
    ]
    assert len(d.op.store) == 0 and d.op.needs_batch_at(T0 + 10**9) is False
    d.close()


class Alarm(hr.StatefulProcessor):
    """Processing-time timers: one 10 s after each key's first row; re-armed once."""

    def init(self, handle: hr.StatefulProcessorHandle) -> None:
        self.fired = handle.get_value_state("fired", "n BIGINT")

    def handle_input_rows(self, key: tuple[Any, ...], rows: pa.Table, tv: hr.TimerValues) -> Iterator[Any]:
        if not list(self.handle.list_timers()):
            self.handle.register_timer(tv.current_processing_time_ms + 10_000)
        return iter(())

    def handle_expired_timer(self, key: tuple[Any, ...], tv: hr.TimerValues, info: hr.ExpiredTimerInfo
                             ) -> Iterator[Any]:  # fmt: skip
        n = (self.fired.get() or (0,))[0] + 1
        self.fired.update((n,))
        if n == 1:
            self.handle.register_timer(tv.current_processing_time_ms + 1_000)
        yield (key[0], info.expiry_time_ms - T0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_processing_time_timers_fire_by_the_batch_timestamp(tmp_path: Path, backend: str) -> None:
    d = Driver(tws(Alarm(), "user STRING, at BIGINT"), tmp_path, backend)
    assert d.batch(0, rows(("a", 1, 0)), ts=T0) == []
    assert d.batch(1, rows(("b", 1, 0), ("a", 1, 0)), ts=T0 + 4_000) == []
    assert d.op.needs_batch_at_time(T0 + 10_000) is False and d.op.needs_batch_at_time(T0 + 10_001) is True
    assert d.batch(2, None, ts=T0 + 10_001) == [{"user": "a", "at": 10_000}]
    assert d.batch(3, None, ts=T0 + 20_000) == [{"user": "a", "at": 11_001}, {"user": "b", "at": 14_000}]
    # a replay of batch 3 (same recorded timestamp) fires the same timers
    assert d.batch(3, None, ts=T0 + 20_000) == [{"user": "a", "at": 11_001}, {"user": "b", "at": 14_000}]
    d.close()


class Seeded(Counting):
    def handle_initial_state(self, key: tuple[Any, ...], initial_state: pa.Table, tv: hr.TimerValues) -> None:
        self.count.update((sum(initial_state.column("n").to_pylist()),))


@pytest.mark.parametrize("backend", BACKENDS)
def test_initial_state_is_handled_in_the_first_batch_only(tmp_path: Path, backend: str) -> None:
    init = pa.table({"user": ["a", "c", "a"], "n": [10, 100, 5]})
    d = Driver(tws(Seeded(), initial_state=hr.StaticFrame.from_arrow(init)), tmp_path, backend)
    assert by_user(d.batch(0, rows(("a", 1, 0), ("b", 1, 0)))) == [("a", 16), ("b", 1)]
    assert by_user(d.batch(1, rows(("c", 1, 0)))) == [("c", 101)]
    d.close()
    d = Driver(tws(Seeded(), initial_state=init), tmp_path, backend, last=1)  # not again on a restart
    assert by_user(d.batch(2, rows(("a", 1, 0)))) == [("a", 17)]
    d.close()


class Renamed(Counting):
    def init(self, handle: hr.StatefulProcessorHandle) -> None:
        self.count = handle.get_value_state("total", "n BIGINT")


class Widened(Counting):
    def init(self, handle: hr.StatefulProcessorHandle) -> None:
        self.count = handle.get_value_state("count", "n BIGINT, extra STRING")


class Ttl(Counting):
    def init(self, handle: hr.StatefulProcessorHandle) -> None:
        self.count = handle.get_value_state("count", "n BIGINT", ttl="1 day")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("changed", [Renamed, Widened], ids=["renamed-variable", "changed-schema"])
def test_changed_state_variables_are_refused_at_start(tmp_path: Path, backend: str, changed: type) -> None:
    d = Driver(tws(Counting()), tmp_path, backend)
    d.batch(0, rows(("a", 1, 0)))
    d.close()
    with pytest.raises(CheckpointError) as e:
        Driver(tws(changed()), tmp_path, backend, last=0)
    msg = str(e.value)
    assert "variables" in msg and "count: value<n BIGINT>" in msg and "new checkpointLocation" in msg


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_ttl_may_change_between_runs(tmp_path: Path, backend: str) -> None:
    d = Driver(tws(Counting()), tmp_path, backend)
    d.batch(0, rows(("a", 1, 0)))
    d.close()
    d = Driver(tws(Ttl()), tmp_path, backend, last=0)
    assert by_user(d.batch(1, rows(("a", 1, 0)))) == [("a", 2)]
    d.close()


def test_a_changed_time_mode_is_refused(tmp_path: Path) -> None:
    d = Driver(tws(Counting()), tmp_path, "memory")
    d.batch(0, rows(("a", 1, 0)))
    d.close()
    with pytest.raises(CheckpointError, match="timeMode"):
        Driver(tws(Counting(), time_mode="none"), tmp_path, "memory", last=0)


NOT_A_PROCESSOR: Any = object()


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: tws(Counting(), mode="complete"), UnsupportedError, "append' or 'update"),
        (lambda: tws(Counting(), time_mode="event_time"), UnsupportedError, "needs a watermark"),
        (lambda: tws(Counting(), time_mode="sometimes"), HeadraceError, "time_mode 'sometimes'"),
        (lambda: tws(Counting(), out="user STRANGE"), HeadraceError, "output_schema"),
        (
            lambda: TransformWithStateOperator(["user"], NOT_A_PROCESSOR, "n BIGINT"),
            HeadraceError,
            "StatefulProcessor",
        ),
    ],
    ids=[
        "complete-mode",
        "event-time-without-watermark",
        "bad-time-mode",
        "bad-output-schema",
        "not-a-processor",
    ],
)
def test_bad_arguments_are_refused_at_definition(make: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        make()


class TtlWithoutTime(Counting):
    def init(self, handle: hr.StatefulProcessorHandle) -> None:
        self.count = handle.get_value_state("count", "n BIGINT", ttl="1 hour")


class TimerWithoutTime(Counting):
    def handle_input_rows(self, key: tuple[Any, ...], rows: pa.Table, tv: hr.TimerValues) -> Iterator[Any]:
        self.handle.register_timer(1)
        return iter(())


def test_ttl_and_timers_need_a_time_mode(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedError, match="TTL needs time_mode 'processing_time'"):
        Driver(tws(TtlWithoutTime(), time_mode="none"), tmp_path / "a", "memory")
    # as in Spark (STATEFUL_PROCESSOR_INCORRECT_TIME_MODE_TO_ASSIGN_TTL): not in event-time mode either
    with pytest.raises(UnsupportedError, match="INCORRECT_TIME_MODE_TO_ASSIGN_TTL"):
        Driver(tws(TtlWithoutTime(), time_mode="event_time", watermark_column="ts"), tmp_path / "e", "memory")
    d = Driver(tws(TimerWithoutTime(), time_mode="none"), tmp_path / "b", "memory")
    with pytest.raises(UnsupportedError, match="timers need time_mode"):
        d.batch(0, rows(("a", 1, 0)))
    d.close()
    with pytest.raises(HeadraceError, match="ttl must be positive"):
        Driver(tws(Counting(ttl=0)), tmp_path / "c", "memory")


def test_output_that_does_not_fit_the_schema_names_the_method(tmp_path: Path) -> None:
    class Bad(Counting):
        def handle_input_rows(
            self, key: tuple[Any, ...], rows: pa.Table, tv: hr.TimerValues
        ) -> Iterator[Any]:
            yield (key[0],)

    d = Driver(tws(Bad()), tmp_path, "memory")
    with pytest.raises(HeadraceError, match=r"Bad.handle_input_rows yielded the row \('a',\) of 1 values"):
        d.batch(0, rows(("a", 1, 0)))
    d.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_real_time_calls_once_per_row_and_fires_processing_timers_at_the_end(
    tmp_path: Path, backend: str
) -> None:
    calls: list[int] = []

    class PerRow(Alarm):
        def handle_input_rows(
            self, key: tuple[Any, ...], rows: pa.Table, tv: hr.TimerValues
        ) -> Iterator[Any]:
            calls.append(rows.num_rows)
            self.handle.register_timer(T0 - 1)  # already due: fires when the batch ends
            yield (key[0], -1)

    d = Driver(tws(PerRow(), "user STRING, at BIGINT"), tmp_path, backend, real_time=True)
    out = d.batch(0, rows(("a", 1, 0), ("a", 2, 0), ("b", 3, 0)), chunks=2)
    assert calls == [1, 1, 1]
    assert out == [{"user": "a", "at": -1}, {"user": "a", "at": -1}, {"user": "b", "at": -1},
                   {"user": "a", "at": -1 - 0}, {"user": "b", "at": -1}][:3] + out[3:]  # fmt: skip
    assert sorted((r["user"], r["at"]) for r in out[3:]) == [("a", -1), ("b", -1)]
    d.close()
    with pytest.raises(UnsupportedError, match="event-time timers are not supported in real-time mode"):
        Driver(tws(Sessions(), time_mode="event_time", watermark_column="ts"), tmp_path / "e", backend,
               real_time=True)  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batch_costs_the_keys_it_touches_not_the_state(tmp_path: Path, backend: str) -> None:
    """The store work of a batch touching 50 keys is the same with 200 and with 5,000 keys in
    state (WorkCounters), and the timers that do not fire are not read."""

    def work(keys_in_state: int, path: Path) -> dict[str, int]:
        d = Driver(tws(Alarm(), "user STRING, at BIGINT"), path, backend)
        users = [f"u{i}" for i in range(keys_in_state)]
        d.batch(0, pa.table({"user": users, "v": [1] * len(users), "ts": pa.nulls(len(users), IN.field("ts").type)},
                            schema=IN), ts=T0)  # fmt: skip
        stores = d.op._stores()
        before = [s.work.copy() for s in stores]
        d.batch(1, pa.table({"user": users[:50], "v": [1] * 50, "ts": pa.nulls(50, IN.field("ts").type)},
                            schema=IN), ts=T0 + 1)  # fmt: skip
        total: dict[str, int] = {}
        for s, b in zip(stores, before, strict=True):
            for k, v in s.work.minus(b).items():
                total[k] = total.get(k, 0) + v
        d.close()
        return total

    small, large = work(200, tmp_path / "small"), work(5_000, tmp_path / "large")
    assert small == large, (small, large)


def test_through_the_engine_with_the_stream_api(tmp_path: Path) -> None:
    name = f"tws-{uuid.uuid4().hex[:6]}"
    schema = pa.schema([("user", pa.string()), ("v", pa.int64())])
    stream = memory_stream(name, schema)
    frame = (hr.read_stream.format("memory").option("name", name).load()
             .groupBy("user").transformWithStateInPandas(Counting(), "user STRING, n BIGINT", "update", "ProcessingTime"))  # fmt: skip
    q = (frame.write_stream.format("memory").query_name(name + "-out").output_mode("update")
         .option("checkpointLocation", str(tmp_path / "chk")).trigger(processing_time="10 milliseconds").start())  # fmt: skip
    try:
        for b in range(3):
            stream.add(pa.table({"user": ["a", "b", "a"][: b + 1], "v": [1, 2, 3][: b + 1]}, schema=schema))
            q.process_all_available(30)
    finally:
        q.stop()
    got = sorted((r["user"], r["n"]) for r in hr.memory_table(name + "-out").to_pylist())
    assert got == [("a", 1), ("a", 2), ("a", 4), ("b", 1), ("b", 2)]
    assert (tmp_path / "chk" / "state" / "0" / "vars" / "count" / "metadata").is_file()


def test_group_by_a_window_is_refused() -> None:
    s = hr.read_stream.format("rate-micro-batch").option("rowsPerBatch", 10).load()
    with pytest.raises(HeadraceError, match="groups by columns only"):
        s.group_by(hr.window("timestamp", "1 minute")).transform_with_state(Counting(), "n BIGINT")


class Reminder(hr.StatefulProcessor):
    """A processing-time timer 300 ms after each key's first row; it emits once."""

    def init(self, handle: hr.StatefulProcessorHandle) -> None:
        self.armed = handle.get_value_state("armed", "at BIGINT")

    def handle_input_rows(self, key: tuple[Any, ...], rows: pa.Table, tv: hr.TimerValues) -> Iterator[Any]:
        if not self.armed.exists():
            self.armed.update((tv.current_processing_time_ms + 300,))
            self.handle.register_timer(tv.current_processing_time_ms + 300)
        return iter(())

    def handle_expired_timer(
        self, key: tuple[Any, ...], tv: hr.TimerValues, info: hr.ExpiredTimerInfo
    ) -> Iterator[Any]:
        yield (key[0], info.expiry_time_ms)


def test_a_processing_time_timer_fires_in_a_batch_without_data(tmp_path: Path) -> None:
    """The engine runs a batch with no new data once a processing-time timer is due."""
    import time

    name = f"tws-{uuid.uuid4().hex[:6]}"
    schema = pa.schema([("user", pa.string()), ("v", pa.int64())])
    stream = memory_stream(name, schema)
    frame = (
        hr.read_stream.format("memory").option("name", name).load()
        .group_by("user").transform_with_state(Reminder(), "user STRING, at BIGINT", "update", "processing_time")
    )  # fmt: skip
    q = (
        frame.write_stream.format("memory").query_name(name + "-out").output_mode("update")
        .option("checkpointLocation", str(tmp_path / "chk")).trigger(processing_time="20 milliseconds").start()
    )  # fmt: skip
    try:
        stream.add(pa.table({"user": ["a", "b"], "v": [1, 2]}, schema=schema))
        q.process_all_available(30)
        deadline = time.monotonic() + 30
        while hr.memory_table(name + "-out").num_rows < 2 and time.monotonic() < deadline:
            q.await_termination(0.05)  # the timers are due 300 ms after the batch: no data arrives
        rows = hr.memory_table(name + "-out").to_pylist()
        assert sorted(r["user"] for r in rows) == ["a", "b"]
        assert q.last_progress is not None and q.last_progress["numInputRows"] == 0
    finally:
        q.stop()


class Lifecycle(hr.StatefulProcessor):
    """Counts its init and close calls; per key a list of the values and a timer per row."""

    inits = 0
    closes = 0

    def init(self, handle: hr.StatefulProcessorHandle) -> None:
        type(self).inits += 1
        self.values = handle.get_list_state("values", "v BIGINT")

    def handle_input_rows(self, key: tuple[Any, ...], rows: pa.Table, tv: hr.TimerValues) -> Iterator[Any]:
        for v in rows.column("v").to_pylist():
            self.values.append_value((v,))
            self.handle.register_timer(T0 + 60_000 + v)
        return iter(())

    def close(self) -> None:
        type(self).closes += 1


def test_differences_from_spark_init_once_per_run_and_state_rows_per_key(tmp_path: Path) -> None:
    """Pins two documented differences (docs/transforms.md "Differences from Spark"): ``init``
    and ``close`` run once per query run (Spark: per batch and partition), and the state
    metrics count one row per key and variable (Spark: one per value, element, entry, timer)."""
    d = Driver(tws(Lifecycle()), tmp_path, "memory")
    for n in range(3):
        d.batch(n, rows(("a", 3 * n + 1, 0), ("a", 3 * n + 2, 0), ("b", 3 * n + 3, 0)), ts=T0 + n)
    m = d.op.metrics()
    d.close()
    assert (Lifecycle.inits, Lifecycle.closes) == (1, 1)
    # a: 6 list elements and 6 timers, b: 3 and 3; Spark would count 9 + 9 rows
    assert m["numRowsTotal"] == 4 and m["numRegisteredTimers"] == 2


def test_differences_from_spark_processing_time_runs_no_batch_without_a_due_timer(tmp_path: Path) -> None:
    """Pins a documented difference: in processing-time mode Spark runs a batch without data
    after every batch (so its available-now query does not end); headrace runs one only when a
    timer or a TTL is due, and an available-now query ends after its data."""
    name = f"tws-{uuid.uuid4().hex[:6]}"
    stream = memory_stream(name, pa.schema([("user", pa.string()), ("v", pa.int64()),
                                            ("ts", pa.timestamp("us", tz="UTC"))]))  # fmt: skip
    stream.add(rows(("a", 1, 0), ("b", 1, 0)))
    frame = (hr.read_stream.format("memory").option("name", name).load()
             .group_by("user").transform_with_state(Counting(ttl="1 hour"), "user STRING, n BIGINT", "update",
                                                    "processing_time"))  # fmt: skip
    q = (frame.write_stream.format("memory").query_name(name + "-out").output_mode("update")
         .option("checkpointLocation", str(tmp_path / "chk")).trigger(available_now=True).start())  # fmt: skip
    assert q.await_termination(60), "an available-now query in processing-time mode did not end"
    assert [p["batchId"] for p in q.recent_progress] == [0]


def test_event_time_mode_drops_rows_the_late_watermark_passed(tmp_path: Path) -> None:
    """As Spark's TransformWithStateExec in EventTime mode: rows at or before the watermark
    for late events never reach the processor, and are counted as dropped."""
    op = tws(Counting(), time_mode="event_time", watermark_column="ts")
    d = Driver(op, tmp_path, "memory")
    assert by_user(d.batch(0, rows(("a", 1, 5_000), ("a", 1, 10_000), ("a", 1, 20_000)), wm=T0 + 10_000)) == [
        ("a", 1)
    ]
    assert d.op.metrics()["numRowsDroppedByWatermark"] == 2
    assert by_user(d.batch(1, rows(("a", 1, 10_001)), wm=T0 + 10_000)) == [("a", 2)]
    d.close()
