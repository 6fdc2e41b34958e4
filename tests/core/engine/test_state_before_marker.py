"""The state of batch n is durable before batch n's commit marker: the stateful operators'
changelogs are written and fsynced on the state stores' threads while the sink writes, and the
engine writes the marker only once they are done. A changelog whose write fails fails its
batch: no marker, and the restart replays it from the state of batch n-1."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import headrace as hr
import headrace.state.store as state_store

PER = 30
BATCHES = 6
START_MS = 1_700_000_000_000


def query(chk: Path, name: str, backend: str, *, mode: str = "update", watermark: bool = True) -> hr.StreamingQuery:
    s = hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=PER, totalRows=PER * BATCHES, numPartitions=2,
                                                          startTimestamp=START_MS, advanceMillisPerBatch=1000).load()  # fmt: skip
    if watermark:
        s = s.with_watermark("timestamp", "2 seconds")
    frame = s.with_column("k", "value % 4").group_by("k").agg("count(*) AS n")
    w = (frame.write_stream.format("memory").query_name(name).option("checkpointLocation", str(chk))
         .option("stateStore", backend).output_mode(mode).trigger(available_now=True))  # fmt: skip
    return w.start()


def markers(chk: Path) -> set[int]:
    return {int(n) for n in os.listdir(chk / "commits") if n.isdigit()}


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@pytest.mark.parametrize("watermark", [True, False], ids=["marker-written-whole", "marker-linked"])
def test_a_failed_state_write_leaves_no_marker_and_the_batch_is_replayed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str, watermark: bool
) -> None:
    if backend == "rocksdb":
        pytest.importorskip("rocksdict")
    chk = tmp_path / "chk"
    name = f"durable-{backend}-{watermark}"
    real = state_store.write_state_file

    def failing(path: str, *args: Any, **kwargs: Any) -> int:
        if path.endswith(os.path.join("changelog", "2")):
            raise OSError(28, "No space left on device (injected)")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(state_store, "write_state_file", failing)
    q = query(chk, name, backend, watermark=watermark)
    with pytest.raises(Exception, match="injected"):
        q.await_termination()
    assert markers(chk) == {0, 1}  # batch 2's marker waited for its state, which never became durable
    assert not [p.name for p in (chk / "commits").iterdir() if p.name.endswith(".tmp")]  # nor its temporary file
    assert (chk / "offsets" / "2").exists()

    monkeypatch.setattr(state_store, "write_state_file", real)
    q = query(chk, name, backend, watermark=watermark)
    q.await_termination()
    assert markers(chk) >= set(range(BATCHES))
    # update mode: the last row per key holds its count over all rows, replayed batch 2 included
    last: dict[int, int] = {}
    for row in hr.memory_table(name).to_pylist():
        last[row["k"]] = row["n"]
    assert last == dict(Counter(v % 4 for v in range(PER * BATCHES)))


def test_commit_without_waiting_is_durable_once_its_pending_write_returns(tmp_path: Path) -> None:
    import pyarrow as pa

    from headrace.state import open_state_store
    from headrace.state.version_files import read_state_file

    s = open_state_store("memory", str(tmp_path), pa.schema([("k", pa.int64())]), pa.schema([("n", pa.int64())]))
    s.load(-1)
    s.put(pa.table({"k": [1, 2]}), pa.table({"n": [10, 20]}))
    s.commit(0, wait=False)
    assert len(s) == 2 and s.version == 0  # the working state is at version 0 at once
    pending = s.pending_write()  # started on the state I/O threads; result() waits for it
    assert pending is not None
    pending.result()
    assert read_state_file(s.changelog_path(0)).num_rows == 2
    s.flush()
    assert s.pending_write() is None
    s.close()


def test_a_pending_write_runs_once_and_reports_its_error_to_every_caller() -> None:
    import threading

    from headrace.state import PendingWrite

    calls: list[str] = []

    def write() -> None:
        calls.append(threading.current_thread().name)
        raise OSError(5, "I/O error (injected)")

    w = PendingWrite(write)
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            w.result()
        except OSError as e:
            errors.append(e)

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(errors) == 4 and w.done()
