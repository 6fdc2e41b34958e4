"""Aggregations (update mode) and drop_duplicates in real-time batches through the engine:
rows are emitted per chunk as they arrive, state is committed when each long batch closes."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import headrace as hr
from headrace.testing import wait_for

pytest.importorskip("duckdb")


def run(frame: hr.StreamFrame, tmp_path: Path, backend: str, mode: str) -> tuple[list[dict[str, Any]], int]:
    name = f"rt-{uuid.uuid4().hex[:6]}"
    q = (frame.write_stream.format("memory").query_name(name).option("checkpointLocation", str(tmp_path / "chk"))
         .option("stateStore", backend).output_mode(mode).trigger(real_time="300 milliseconds").start())  # fmt: skip
    try:
        wait_for(lambda: len(q.recent_progress) >= 2, timeout=30)
    finally:
        q.stop()
    assert q.exception() is None
    rows = sum(p["numInputRows"] for p in q.recent_progress)
    return hr.memory_table(name).to_pylist(), rows


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_real_time_count_per_key_emits_per_chunk(tmp_path: Path, backend: str) -> None:
    frame = (hr.read_stream.format("rate").option("rowsPerSecond", 2000).load()
             .with_column("k", "value % 5").group_by("k").count())  # fmt: skip
    out, n = run(frame, tmp_path, backend, "update")
    latest: dict[int, int] = {}
    per_key_updates: Counter[int] = Counter()
    for r in out:  # in emission order
        latest[r["k"]] = r["count"]
        per_key_updates[r["k"]] += 1
    assert latest == {k: len(range(k, n, 5)) for k in range(5)}
    assert max(per_key_updates.values()) > 2, "counts were not emitted per chunk"


def test_real_time_drop_duplicates(tmp_path: Path) -> None:
    frame = hr.read_stream.format("rate").option("rowsPerSecond", 2000).load().with_column("k", "value % 5") \
        .drop_duplicates("k")  # fmt: skip
    out, n = run(frame, tmp_path, "memory", "append")
    assert n > 5
    assert sorted(r["k"] for r in out) == [0, 1, 2, 3, 4]
    assert sorted(r["value"] for r in out) == [0, 1, 2, 3, 4]
