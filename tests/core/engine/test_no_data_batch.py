"""A batch without data runs when the watermark moves only if a stateful operator would emit
or evict in it (Operator.needs_batch_at); its output is the same either way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import headrace as hr

START_MS = 1_700_000_000_000  # 20 s past a minute


def run(tmp_path: Path, name: str, mode: str, advance_ms: int, batches: int, backend: str) -> list[dict[str, Any]]:
    progress: list[dict[str, Any]] = []
    q = (hr.read_stream.format("rate-micro-batch")
         .options(rowsPerBatch=100, totalRows=100 * batches, startTimestamp=START_MS,
                  advanceMillisPerBatch=advance_ms).load()
         .with_watermark("timestamp", "10 seconds")
         .group_by(hr.window("timestamp", "1 minute")).count()
         .write_stream.format("memory").query_name(name).output_mode(mode).option("stateStore", backend)
         .option("checkpointLocation", str(tmp_path / name)).on_progress(lambda p: progress.append(p.to_dict()))
         .trigger(available_now=True).start())  # fmt: skip
    q.await_termination()
    return progress


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_no_batch_when_no_window_closes(tmp_path: Path, backend: str) -> None:
    if backend == "rocksdb":
        pytest.importorskip("rocksdict")
    # 3 batches 5 s apart: the watermark (10 s behind) ends at 20 s + 10 s - 10 s, no window ends
    progress = run(tmp_path, f"nodata_none_{backend}", "update", 5_000, 3, backend)
    assert [p["numInputRows"] for p in progress] == [100, 100, 100]
    assert sum(r["count"] for r in hr.memory_table(f"nodata_none_{backend}").to_pylist()[-1:]) == 300


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_a_batch_without_data_emits_the_window_the_watermark_closed(tmp_path: Path, backend: str) -> None:
    if backend == "rocksdb":
        pytest.importorskip("rocksdict")
    # 2 batches 60 s apart (minutes 0 and 1): after the second the watermark passes minute 0's
    # end; append mode emits it in a batch without data
    name = f"nodata_closes_{backend}"
    progress = run(tmp_path, name, "append", 60_000, 2, backend)
    assert [p["numInputRows"] for p in progress] == [100, 100, 0]
    assert [r["count"] for r in hr.memory_table(name).to_pylist()] == [100]
