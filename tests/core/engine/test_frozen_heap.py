"""While a query runs, the objects alive at its start sit in the collector's permanent
generation; the last query to stop unfreezes them, unless the application had frozen its own."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

import headrace as hr


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def _query(tmp_path: Path, name: str, release: threading.Event, seen: list[int]) -> hr.StreamingQuery:
    def hold(table: pa.Table, batch_id: int) -> None:
        seen.append(gc.get_freeze_count())
        release.wait(30)

    return (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=10, totalRows=10).load()
            .write_stream.foreach_batch(hold).option("checkpointLocation", str(tmp_path / name))
            .trigger(available_now=True).start())  # fmt: skip


def test_frozen_while_queries_run_and_unfrozen_after_the_last(tmp_path: Path) -> None:
    first, second = threading.Event(), threading.Event()
    seen: list[int] = []
    q1 = _query(tmp_path, "a", first, seen)
    q2 = _query(tmp_path, "b", second, seen)
    assert gc.get_freeze_count() > 0
    first.set()
    q1.await_termination(30)
    assert gc.get_freeze_count() > 0  # the other query still runs
    second.set()
    q2.await_termination(30)
    assert gc.get_freeze_count() == 0
    assert len(seen) == 2 and all(n > 0 for n in seen)


def test_the_applications_own_freeze_is_kept(tmp_path: Path) -> None:
    gc.freeze()
    done = threading.Event()
    done.set()
    q = _query(tmp_path, "c", done, [])
    q.await_termination(30)
    assert gc.get_freeze_count() > 0
