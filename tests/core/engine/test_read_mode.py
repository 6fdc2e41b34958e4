"""The choice between reader threads and the query's thread for a batch's partitions
(headrace.engine.read_mode), and that either gives the same output."""

from __future__ import annotations

import itertools
import threading

import pyarrow as pa
import pytest

import headrace as hr
from headrace.connectors.memory import memory_table
from headrace.engine.read_mode import ReadMode

ROWS = 10_000


def run(mode: ReadMode, costs: dict[bool, float], batches: int) -> list[bool]:
    """Drive ``mode`` for ``batches`` batches whose read costs ``costs[parallel]`` a row."""
    chosen = []
    for _ in range(batches):
        parallel = mode.parallel()
        chosen.append(parallel)
        mode.record(parallel, ROWS, costs[parallel] * ROWS)
    return chosen


def test_starts_with_reader_threads_and_probes_the_query_thread_after_16_batches() -> None:
    chosen = run(ReadMode(), {True: 2e-6, False: 1e-6}, 20)
    assert chosen == [True] * 16 + [False] * 4  # the probe won: kept


def test_keeps_reader_threads_when_they_are_cheaper() -> None:
    mode = ReadMode()
    chosen = run(mode, {True: 1e-6, False: 3e-6}, 80)
    assert mode.parallel_mode is True
    # a losing probe after 16 batches, the next 32 batches later
    assert [i for i, c in enumerate(chosen) if not c] == [16, 49]


@pytest.mark.parametrize("cheaper_by", [0.0, 0.03], ids=["same-cost", "within-margin"])
def test_does_not_switch_for_a_difference_within_the_margin(cheaper_by: float) -> None:
    mode = ReadMode()
    chosen = run(mode, {True: 1e-6, False: 1e-6 * (1 - cheaper_by)}, 20)
    assert chosen[16] is False  # probed
    assert mode.parallel_mode is True


def test_switches_back_when_the_probe_of_threads_wins() -> None:
    mode = ReadMode()
    run(mode, {True: 2e-6, False: 1e-6}, 20)
    assert mode.parallel_mode is False
    # the reads start waiting (a slow server): threads are cheaper now
    chosen = run(mode, {True: 1e-6, False: 4e-6}, 40)
    assert mode.parallel_mode is True
    assert chosen.index(True) <= 16


def test_probe_interval_is_capped() -> None:
    mode = ReadMode(first_probe_after=2, max_probe_after=8)
    chosen = run(mode, {True: 1e-6, False: 5e-6}, 200)
    assert chosen[:3] == [True, True, False]
    probes = [i for i, c in enumerate(chosen) if not c]
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    assert max(gaps) == 9  # 8 batches in the mode kept, then the probe


@pytest.mark.parametrize(("rows", "seconds"), [(10, 1.0), (ROWS, 0.0)], ids=["tiny-batch", "no-time"])
def test_batches_that_say_nothing_are_not_measured(rows: int, seconds: float) -> None:
    mode = ReadMode()
    for _ in range(40):
        assert mode.parallel() is True  # nothing measured: no probe
        mode.record(True, rows, seconds)


def _run_query(tmp_path, name: str) -> tuple[list[int], set[str]]:  # type: ignore[no-untyped-def]
    threads: set[str] = set()

    def tag(t: pa.Table) -> pa.Table:
        threads.add(threading.current_thread().name)
        return t

    q = (hr.read_stream.format("rate-micro-batch")
         .options(rowsPerBatch=20_000, totalRows=100_000, numPartitions=4, startTimestamp=0).load()
         .map_batches(tag)
         .write_stream.format("memory").option("checkpointLocation", str(tmp_path / name))
         .query_name(name).trigger(available_now=True).start())  # fmt: skip
    q.await_termination()
    return memory_table(name).column("value").to_pylist(), threads


class _Fixed(ReadMode):
    def __init__(self, parallel: bool) -> None:
        super().__init__()
        self.fixed = parallel

    def parallel(self) -> bool:
        return self.fixed


@pytest.mark.parametrize("parallel", [True, False], ids=["reader-threads", "query-thread"])
def test_either_mode_gives_every_row_once_in_order(tmp_path, monkeypatch, parallel: bool) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(ReadMode, "for_sources", lambda sources: _Fixed(parallel))
    name = f"read_mode_{'par' if parallel else 'ser'}"
    values, threads = _run_query(tmp_path, name)
    assert values == list(range(100_000))  # every row once, partitions in order within each batch
    readers = {t for t in threads if t.startswith("headrace-read")}
    if parallel:
        assert readers, threads
    else:
        assert not readers, threads


def test_sources_whose_reads_do_not_wait_start_on_the_query_thread() -> None:
    class Waits:
        reads_wait = True

    class InProcess:
        reads_wait = False

    assert ReadMode.for_sources([Waits(), InProcess()]).parallel_mode is True
    mode = ReadMode.for_sources([InProcess()])
    chosen = run(mode, {True: 2e-6, False: 1e-6}, 40)
    assert [i for i, c in enumerate(chosen) if c] == [16]  # reader threads tried once, after 16 batches
    assert mode.parallel_mode is False
    mode = ReadMode.for_sources([InProcess()])
    chosen = run(mode, {True: 1e-6, False: 3e-6}, 20)
    assert chosen[16] is True and mode.parallel_mode is True  # threads won: kept
