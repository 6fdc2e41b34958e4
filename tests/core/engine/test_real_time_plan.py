"""Plans in real-time mode: SQL steps, stream-static joins and stateful operators run per
chunk; a long-running batch interrupted before its end is replayed from state ``n - 1``."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

import headrace as hr
from headrace.checkpoint import Checkpoint, OffsetEntry
from headrace.errors import UnsupportedError
from headrace.testing import wait_for
from tests.core.engine.operators import RunningCount


def start(frame: hr.StreamFrame, chk: Path, name: str, mode: str = "append") -> hr.StreamingQuery:
    return (frame.write_stream.format("memory").query_name(name).output_mode(mode)
            .option("checkpointLocation", str(chk)).trigger(real_time="300 milliseconds").start())  # fmt: skip


def test_sql_steps_and_a_stream_static_join_run_per_chunk(tmp_path: Path) -> None:
    labels = pa.table({"bucket": [0, 1, 2], "label": ["zero", "one", "two"]})
    frame = (hr.read_stream.format("rate").option("rowsPerSecond", 1000).load()
             .select_expr("value", "value % 4 AS bucket").where("bucket < 3")
             .join(labels, on="bucket", how="inner").with_column("tag", "label || '-' || CAST(value AS VARCHAR)"))  # fmt: skip
    name = f"rtj-{uuid.uuid4().hex[:6]}"
    q = start(frame, tmp_path / "chk", name)
    try:
        wait_for(lambda: len(q.recent_progress) >= 2, timeout=30)
    finally:
        q.stop()
    out = hr.memory_table(name).to_pylist()
    assert out and all(r["bucket"] == r["value"] % 4 and r["bucket"] < 3 for r in out)
    assert all(r["tag"] == f"{['zero', 'one', 'two'][r['bucket']]}-{r['value']}" for r in out)
    committed = sum(p["numInputRows"] for p in q.recent_progress)
    assert sorted(r["value"] for r in out) == [v for v in range(committed) if v % 4 < 3]


def test_an_interrupted_long_batch_is_replayed_from_the_previous_state_version(tmp_path: Path) -> None:
    chk = tmp_path / "chk"
    frame = hr.read_stream.format("rate").option("rowsPerSecond", 2000).load().apply_operator(RunningCount())
    name = f"rts-{uuid.uuid4().hex[:6]}"
    q = start(frame, chk, name, mode="update")
    try:
        wait_for(lambda: len(q.recent_progress) >= 2, timeout=30)
    finally:
        q.stop()
    cp = Checkpoint(str(chk))
    last = cp.batch_ids()[-1]
    entry = cp.read_offsets(last)
    state = chk / "state" / "0"
    before = json.loads((state / f"{last - 1}.json").read_text())["total"]
    assert before == sum(p["numInputRows"] for p in q.recent_progress if p["batchId"] < last) > 0
    # as if the process died after the operator wrote state version `last` but before the sink
    # committed and before the end offset was recorded: the batch must start again from `last - 1`
    (chk / "commits" / str(last)).unlink()
    cp.write_offsets(OffsetEntry(last, entry.starts, [None], entry.timestamp_ms, real_time=True, metadata=entry.metadata))
    (state / f"{last}.json").write_text(json.dumps({"total": 10**9}))  # a state the replay must not use
    q = start(frame, chk, name, mode="update")
    try:
        wait_for(lambda: len(q.recent_progress) >= 1, timeout=30)
    finally:
        q.stop()
    replayed = q.recent_progress[0]
    assert replayed["batchId"] == last
    total = json.loads((state / f"{last}.json").read_text())["total"]
    assert total == before + replayed["numInputRows"]


def test_drop_duplicates_within_watermark_and_append_aggregations_are_refused(tmp_path: Path) -> None:
    class WithinWatermark(RunningCount):
        within_watermark = True

    frame = hr.read_stream.format("rate").load().apply_operator(WithinWatermark())
    with pytest.raises(UnsupportedError, match="not supported in real-time mode"):
        start(frame, tmp_path / "chk", "rt-refused", mode="update")
    assert not (tmp_path / "chk").exists(), "a refused query creates no checkpoint"
