"""The reader threads are shared by the process: a query's lane bounds its reads, keeps
partition order, and its shutdown waits for its running reads."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, cast

import pyarrow as pa
import pytest

from headrace.engine.crash import CrashHook
from headrace.engine.reader import BatchCounts, ReadLane, read_partitions
from headrace.protocols import Partition


class _Src:
    """Each partition is an int; reading it records the concurrent readers and its thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.peak = 0
        self.threads: set[int] = set()

    def read(self, p: Any) -> Iterator[pa.RecordBatch]:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
            self.threads.add(threading.get_ident())
        try:
            for j in range(3):
                yield pa.record_batch({"p": [p] * 4, "j": [j] * 4})
        finally:
            with self.lock:
                self.running -= 1


def _read(src: _Src, lane: ReadLane, n: int) -> list[tuple[int, int]]:
    counts = BatchCounts(input_rows=[0])
    parts = cast(list[tuple[int, Partition]], [(0, k) for k in range(n)])  # _Src reads int partitions
    out = list(read_partitions([src], parts, None, counts,  # type: ignore[list-item]
                               batch_id=0, pool=lane, crash=CrashHook()))  # fmt: skip
    assert counts.input_rows == [12 * n]
    return [(b.column(0)[0].as_py(), b.column(1)[0].as_py()) for b in out]


@pytest.mark.parametrize("parallelism", [1, 2, 3], ids=["one-thread", "two-threads", "three-threads"])
def test_partitions_come_in_order_and_at_most_parallelism_read_at_once(parallelism: int) -> None:
    src = _Src()
    lane = ReadLane(parallelism)
    got = _read(src, lane, 7)
    assert got == [(k, j) for k in range(7) for j in range(3)]
    assert src.peak <= parallelism + 1  # the lane's threads, and the consumer reading one it reached first
    lane.shutdown(wait=True)
    assert src.running == 0


def test_reader_threads_are_reused_between_queries() -> None:
    from headrace.engine import reader

    src = _Src()
    lane = ReadLane(2)
    _read(src, lane, 2)
    lane.shutdown(wait=True)
    before = len(reader._read_pool()._threads)
    for _ in range(10):  # ten more queries one after the other, two partitions each
        lane = ReadLane(2)
        _read(src, lane, 2)
        lane.shutdown(wait=True)
    # a new pool per query would start 20 threads; a reused one starts one only when a worker
    # has finished its read but not yet counted itself idle (a race in ThreadPoolExecutor)
    assert len(reader._read_pool()._threads) <= before + 5


def test_the_consumer_reads_a_partition_no_reader_thread_has_claimed() -> None:
    """The runners start after the consumer has claimed partition 0 (they wait for a gate,
    as a pool thread slow to start would), so partition 0 is read on the consumer's thread
    and partition 1 by a runner."""
    src = _Src()
    gate = threading.Event()

    class SlowLane(ReadLane):
        def submit(self, fn: Callable[[], None]) -> Future[None]:
            return super().submit(lambda: (gate.wait(5), cast(Any, fn()))[1])

    lane = SlowLane(2)
    counts = BatchCounts(input_rows=[0])
    it = read_partitions([src], [(0, 0), (0, 1)], None, counts, batch_id=0, pool=lane,  # type: ignore[list-item]
                         crash=CrashHook())  # fmt: skip
    first = next(it)  # partition 0, read here
    assert first.column(0)[0].as_py() == 0
    assert src.threads == {threading.get_ident()}
    gate.set()
    rest = list(it)
    assert [b.column(0)[0].as_py() for b in rest] == [0, 0, 1, 1, 1]
    assert counts.input_rows == [24]
    lane.shutdown(wait=True)


def test_a_shut_down_lane_refuses_reads_and_bad_parallelism_is_refused() -> None:
    lane = ReadLane(2)
    lane.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        lane.submit(lambda: None)
    with pytest.raises(ValueError, match="at least 1, got 0"):
        ReadLane(0)


def test_shutdown_waits_for_a_running_read() -> None:
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def job() -> None:
        started.set()
        release.wait(5)
        finished.set()

    lane = ReadLane(1)
    lane.submit(job)
    assert started.wait(5)
    t = threading.Thread(target=lane.shutdown)
    t.start()
    t.join(0.05)
    assert t.is_alive()  # still waiting for the read
    release.set()
    t.join(5)
    assert finished.is_set() and not t.is_alive()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_reads_with_new_threads() -> None:
    """The parent's idle reader threads do not exist in a forked child: its reads must not
    be queued for them (they would never run)."""
    src = _Src()
    lane = ReadLane(2)
    _read(src, lane, 2)  # the parent's pool has idle threads now
    lane.shutdown(wait=True)
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if a read on the lane's threads completes
        code = 1
        try:
            done = threading.Event()
            child = ReadLane(2)
            child.submit(done.set)
            code = 0 if done.wait(5) else 3
            child.shutdown(wait=False)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
